//! Tests of the `dmabuf-testbed` program itself: each boots the testbed, so they are ignored by
//! a plain `cargo test`; `cargo xtask test` runs them on the host (they start the VMs), or run
//! `cargo test -p dmabuf-testbed --test tool -- --ignored --test-threads=1`.
//!
//! The cache is `$DMABUF_TESTBED_CACHE` when set, else the workspace's `target/testbed` (the
//! one `cargo xtask` fills), so that no test downloads a kernel of its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh folder under the system's temporary folder (`/tmp`), removed when dropped.
struct TmpDir(PathBuf);

impl TmpDir {
    fn new(name: &str) -> TmpDir {
        let dir =
            std::env::temp_dir().join(format!("dmabuf-testbed-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a folder under the temporary folder");
        TmpDir(dir)
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `dmabuf-testbed args...` in `cwd`; returns its output (stderr has the console).
fn tool(cwd: &Path, args: &[&str]) -> Output {
    let cache = std::env::var_os(dmabuf_testbed::CACHE_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/testbed"));
    // The program under test, built by this workspace.
    let out = Command::new(env!("CARGO_BIN_EXE_dmabuf-testbed"))
        .args(args)
        .current_dir(cwd)
        .env(dmabuf_testbed::CACHE_ENV, cache)
        .output()
        .expect("dmabuf-testbed starts");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
#[ignore = "boots the testbed: cargo xtask test runs it on the host"]
fn the_exit_status_and_a_writable_working_folder_under_tmp() {
    let dir = TmpDir::new("cwd");
    std::fs::write(dir.0.join("input"), "from the host\n").unwrap();
    let script = "pwd > where; cat input > copy; exit 7";
    let out = tool(
        &dir.0,
        &["run", "--timeout", "600", "--", "sh", "-c", script],
    );
    assert_eq!(
        out.status.code(),
        Some(7),
        "the command's status is the tool's"
    );
    let read = |f: &str| std::fs::read_to_string(dir.0.join(f)).unwrap_or_default();
    assert_eq!(read("where").trim(), dir.0.display().to_string(), "cwd");
    assert_eq!(
        read("copy"),
        "from the host\n",
        "the guest read and wrote the folder"
    );
}

#[test]
#[ignore = "boots the testbed: cargo xtask test runs it on the host"]
fn a_kernel_warning_fails_a_command_that_succeeded() {
    let dir = TmpDir::new("warn");
    let script = "echo 'WARNING: CPU: 0 PID: 1 at tool-test (injected)' > /dev/kmsg; exit 0";
    let out = tool(
        &dir.0,
        &["run", "--timeout", "600", "--", "sh", "-c", script],
    );
    assert_eq!(out.status.code(), Some(1), "a kernel warning fails the run");
    let err = text(&out.stderr);
    assert!(err.contains("kernel problems:"), "{err}");
    assert!(err.contains("WARNING: CPU: 0 PID: 1 at tool-test"), "{err}");
}

#[test]
#[ignore = "boots the testbed: cargo xtask test runs it on the host"]
fn node_b_reaches_node_a_at_the_address_it_is_given() {
    let dir = TmpDir::new("nodes");
    // rdma_cm over rxe: node a serves three pings, node b connects to $NODE_A_ADDR (retrying
    // until a's server listens) and records the address it used.
    let script = r#"
        if [ "$NODE" = a ]; then
            rping -s -a "$LOCAL_ADDR" -C 3 -v
        else
            echo "$NODE_A_ADDR" > node-a-addr
            n=0
            until rping -c -a "$NODE_A_ADDR" -C 3 -v; do
                n=$((n+1)); [ $n -lt 30 ] || exit 1
                sleep 1
            done
        fi"#;
    let out = tool(
        &dir.0,
        &[
            "run",
            "--nodes",
            "2",
            "--timeout",
            "900",
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let addr = std::fs::read_to_string(dir.0.join("node-a-addr")).unwrap_or_default();
    assert_eq!(
        addr.trim(),
        "169.254.10.1",
        "node b was given node a's address"
    );
    for node in ["[a]", "[b]"] {
        assert!(
            err.lines()
                .any(|l| l.starts_with(node) && l.contains("ping data:")),
            "{node} printed no rping data:\n{err}"
        );
    }
}

#[test]
#[ignore = "boots the testbed: cargo xtask test runs it on the host"]
fn info_names_the_kernel_the_device_and_the_exporters() {
    let dir = TmpDir::new("info");
    let out = tool(&dir.0, &["info"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    for want in [
        "kernel: 6.12.",
        "rdma device: rxe0",
        "dma-buf exporter: /dev/dri/card0 (vgem",
        "dma-buf exporter: /dev/udmabuf (size_limit_mb 128)",
        "dma-buf exporter: /dev/dma_heap/system",
    ] {
        assert!(err.contains(want), "no `{want}` in:\n{err}");
    }
}

#[test]
fn a_command_is_required_and_bad_options_are_refused() {
    let dir = TmpDir::new("usage");
    for args in [
        &["run"][..],
        &["run", "--nodes", "3", "--", "true"],
        &["frob"],
    ] {
        let out = tool(&dir.0, args);
        assert_eq!(out.status.code(), Some(125), "{args:?}");
    }
}

/// `base/<name>` followed by the path of `base/sibling`: from the folder
/// `/tmp/x/work,path=/tmp/x/sibling`, a `path=` option left unescaped would share the sibling.
fn odd_folder(base: &Path, name: &[u8]) -> (PathBuf, PathBuf) {
    use std::os::unix::ffi::OsStrExt;
    let sibling = base.join("sibling");
    std::fs::create_dir_all(&sibling).unwrap();
    let cwd = base
        .join(std::ffi::OsStr::from_bytes(name))
        .join(sibling.strip_prefix("/").unwrap());
    std::fs::create_dir_all(&cwd).unwrap();
    (cwd, sibling)
}

/// Runs a command that writes `marker` and `where` (its `pwd`) from the working folder `cwd`,
/// and checks that the run passed, that both landed in `cwd` (`where` naming it byte for
/// byte) and that nothing landed in `sibling`.
fn writes_land_in(cwd: &Path, sibling: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let script = "echo hi > marker && pwd > where";
    let out = tool(cwd, &["run", "--timeout", "600", "--", "sh", "-c", script]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "from {cwd:?}:\n{err}");
    let marker = std::fs::read(cwd.join("marker")).unwrap_or_default();
    assert_eq!(marker, b"hi\n", "no marker in {cwd:?}");
    let mut want = cwd.as_os_str().as_bytes().to_vec();
    want.push(b'\n');
    let seen = std::fs::read(cwd.join("where")).unwrap_or_default();
    assert_eq!(text(&seen), text(&want), "the guest's working folder");
    assert_eq!(seen, want, "the guest's working folder, byte for byte");
    let leaked: Vec<_> = std::fs::read_dir(sibling).unwrap().collect();
    assert!(leaked.is_empty(), "the guest wrote into {sibling:?}");
}

#[test]
#[ignore = "boots the testbed: cargo xtask test runs it on the host"]
fn a_comma_and_path_in_the_working_folder_share_only_that_folder() {
    let base = TmpDir::new("comma");
    let (cwd, sibling) = odd_folder(&base.0, b"work,path=");
    writes_land_in(&cwd, &sibling);
}

#[test]
#[ignore = "boots the testbed: cargo xtask test runs it on the host"]
fn spaces_quotes_and_shell_characters_in_the_working_folder_are_carried() {
    let base = TmpDir::new("shell");
    let name = b"a b=c 'd' \"e\" $HOME `f` \\g *h ?[i] ;&|\t,path=";
    let (cwd, sibling) = odd_folder(&base.0, name);
    writes_land_in(&cwd, &sibling);
}

#[test]
#[ignore = "boots the testbed: cargo xtask test runs it on the host"]
fn a_working_folder_that_is_not_utf8_is_carried_byte_for_byte() {
    let base = TmpDir::new("latin1");
    let (cwd, sibling) = odd_folder(&base.0, b"caf\xe9 \xff,path=");
    writes_land_in(&cwd, &sibling);
}

#[test]
fn a_working_folder_with_a_newline_is_refused_by_name() {
    let base = TmpDir::new("newline");
    let cwd = base.0.join("two\nlines");
    std::fs::create_dir_all(&cwd).unwrap();
    let out = tool(&cwd, &["run", "--", "true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    let want =
        format!("the testbed cannot share the folder {cwd:?}: it contains a newline (U+000A)");
    assert!(err.contains(&want), "no `{want}` in:\n{err}");
}
