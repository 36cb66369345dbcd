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
        "libibverbs: /etc/dmabuf-testbed/libibverbs.so.1 = /",
        "rdma device: rxe0",
        "dma-buf exporter: /dev/dri/card0 (vgem",
        "dma-buf exporter: /dev/udmabuf (size_limit_mb 128)",
        "dma-buf exporter: /dev/dma_heap/system",
    ] {
        assert!(err.contains(want), "no `{want}` in:\n{err}");
    }
}

/// Lines of a run's output that come from building or fetching something: after `setup`, a run
/// prints none (no testbed build step, no cargo progress).
fn build_lines(err: &str) -> Vec<&str> {
    err.lines()
        .filter(|l| {
            let l = l.trim_start();
            ["==> building", "==> downloading", "==> unpacking"]
                .iter()
                .any(|s| l.starts_with(s))
                || [
                    "Compiling ",
                    "Downloading ",
                    "Downloaded ",
                    "Updating ",
                    "Locking ",
                ]
                .iter()
                .any(|s| l.starts_with(s))
        })
        .collect()
}

#[test]
#[ignore = "boots the testbed (and builds what the cache lacks): cargo xtask test runs it"]
fn setup_leaves_nothing_for_a_run_to_build() {
    let dir = TmpDir::new("setup");
    let first = tool(&dir.0, &["setup"]);
    let err = text(&first.stderr);
    assert_eq!(first.status.code(), Some(0), "{err}");
    assert!(err.contains("testbed ready in "), "{err}");
    // Everything is built now: a second setup has nothing to do, and says so.
    let second = tool(&dir.0, &["setup"]);
    let err = text(&second.stderr);
    assert_eq!(second.status.code(), Some(0), "{err}");
    assert!(err.contains("(nothing to build, all cached)"), "{err}");
    assert!(build_lines(&err).is_empty(), "{err}");
    let run = tool(&dir.0, &["run", "--timeout", "600", "--", "true"]);
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    assert!(
        build_lines(&err).is_empty(),
        "a run after setup built something:\n{err}"
    );
    // The accelerator is one short line; its details are for --verbose and `info`.
    let accel = err
        .lines()
        .find(|l| l.trim_start().starts_with("QEMU "))
        .unwrap_or_else(|| panic!("no accelerator line in:\n{err}"));
    assert!(accel.trim().len() <= 80, "{accel}");
    assert!(
        !accel.contains("MSR") && !accel.contains("probed"),
        "{accel}"
    );
}

/// The command of the `LD_LIBRARY_PATH` test: registers a udmabuf as a dma-buf MR on rxe0
/// through whatever `libibverbs.so.1` ctypes finds, and writes which files of libibverbs the
/// process maps (`maps`) and the registration's outcome (`mr`: `ok` or the errno).
const REGISTER_DMABUF_MR: &str = r#"
import ctypes, fcntl, os, struct
verbs = ctypes.CDLL("libibverbs.so.1", use_errno=True)
verbs.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
verbs.ibv_open_device.restype = ctypes.c_void_p
verbs.ibv_open_device.argtypes = [ctypes.c_void_p]
verbs.ibv_alloc_pd.restype = ctypes.c_void_p
verbs.ibv_alloc_pd.argtypes = [ctypes.c_void_p]
verbs.ibv_reg_dmabuf_mr.restype = ctypes.c_void_p
verbs.ibv_reg_dmabuf_mr.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t,
                                    ctypes.c_uint64, ctypes.c_int, ctypes.c_int]
size = 1 << 16
memfd = os.memfd_create("mr", os.MFD_ALLOW_SEALING)
os.ftruncate(memfd, size)
fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
dev = os.open("/dev/udmabuf", os.O_RDWR)
# UDMABUF_CREATE: _IOW('u', 0x42, struct udmabuf_create { u32 memfd, flags; u64 offset, size })
# (a mutable buffer: ioctl's own return value, the new dma-buf's fd, comes back)
dmabuf = fcntl.ioctl(dev, 0x40187542, bytearray(struct.pack("IIQQ", memfd, 0, 0, size)), True)
devices = verbs.ibv_get_device_list(None)
ctx = verbs.ibv_open_device(devices[0])
pd = verbs.ibv_alloc_pd(ctx)
mr = verbs.ibv_reg_dmabuf_mr(pd, 0, size, 0x100000, dmabuf, 7)
with open("mr", "w") as f:
    f.write("ok\n" if mr else "errno %d\n" % ctypes.get_errno())
with open("/proc/self/maps") as m, open("maps", "w") as f:
    f.writelines(sorted({l.split(None, 5)[5] for l in m if "libibverbs" in l}))
"#;

#[test]
#[ignore = "boots the testbed: cargo xtask test runs it on the host"]
fn a_command_s_own_ld_library_path_keeps_the_patched_libibverbs() {
    let dir = TmpDir::new("ldpath");
    std::fs::write(dir.0.join("register.py"), REGISTER_DMABUF_MR).unwrap();
    // The system's libibverbs (rdma-core 44, whose rxe provider refuses dma-bufs with
    // EOPNOTSUPP) in a folder of the command's own, which it puts alone on LD_LIBRARY_PATH,
    // as `LD_LIBRARY_PATH=target/release prog` does; then what ldd and the loader say.
    let script = r#"
        mkdir stock && cp /usr/lib/x86_64-linux-gnu/libibverbs.so.1 stock/ || exit 10
        export LD_LIBRARY_PATH="$PWD/stock"
        python3 register.py || exit 11
        LD_TRACE_LOADED_OBJECTS=1 ibv_devinfo > ldd || exit 12
        ibv_devinfo -d rxe0 > devinfo || exit 13
        (cd "$TESTBED_RDMA_LIB" && pwd -P) > patched-lib"#;
    let out = tool(
        &dir.0,
        &["run", "--timeout", "600", "--", "sh", "-c", script],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let read = |f: &str| std::fs::read_to_string(dir.0.join(f)).unwrap_or_default();
    let patched = read("patched-lib");
    let patched = patched.trim();
    assert!(!patched.is_empty(), "no $TESTBED_RDMA_LIB:\n{err}");
    let maps = read("maps");
    let mapped: Vec<&str> = maps.lines().collect();
    assert!(
        !mapped.is_empty() && mapped.iter().all(|l| l.starts_with(patched)),
        "the process mapped another libibverbs than the patched one in {patched}: {maps}"
    );
    assert!(!maps.contains("/stock/"), "{maps}");
    assert_eq!(
        read("mr").trim(),
        "ok",
        "a udmabuf registers as a dma-buf MR"
    );
    let ldd = read("ldd");
    assert!(
        ldd.contains("/etc/dmabuf-testbed/libibverbs.so.1") && !ldd.contains("/stock/"),
        "ldd of ibv_devinfo:\n{ldd}"
    );
    assert!(read("devinfo").contains("rxe0"), "{}", read("devinfo"));
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
