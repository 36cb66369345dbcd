//! `cargo xtask vm`: boots the testbed (one VM, or two joined by a virtual wire) and runs a
//! command inside, chrooted into the host's root so host-built binaries run unchanged.

use crate::accel::{self, Accel};
use crate::patched::Patched;
use crate::sh::{self, Result};
use crate::ui::{info, Step};
use crate::{fail, initramfs, klog, programs, script, setup, Paths};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Which RDMA stack the testbed runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// rxe and rdma-core with `kernel-patches/` applied (dma-buf regions work).
    Patched,
    /// Debian's own rxe and rdma-core.
    Stock,
}

/// How to boot the testbed.
#[derive(Clone, Debug)]
pub struct Opts {
    /// Patched (default) or stock RDMA stack.
    pub mode: Mode,
    /// 1: one VM, an rxe device on a veth pair (loopback); 2: two VMs joined by a wire.
    pub nodes: u8,
    /// The whole run is stopped (and fails) after this long.
    pub timeout: Duration,
    /// Extra environment for the command.
    pub env: Vec<(String, String)>,
    /// Guest memory per VM, in MiB.
    pub mem_mib: u32,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            mode: Mode::Patched,
            nodes: 1,
            timeout: Duration::from_secs(1800),
            env: Vec::new(),
            mem_mib: 2048,
        }
    }
}

/// Environment variable whose value is appended to the guests' kernel command line, for
/// debugging (e.g. `slub_debug=FZPU loglevel=7`).
pub const EXTRA_CMDLINE: &str = "TESTBED_KERNEL_ARGS";

/// Environment variable naming the `qemu-system-x86_64` to run instead of the one on `PATH`
/// (for example a newer QEMU, which avoids the emulator fault described in docs/testbed.md).
pub const QEMU_BINARY: &str = "TESTBED_QEMU";

/// 2 MiB huge pages every guest reserves at boot (`hugepages=` on its command line), for the
/// tests of udmabufs over hugetlb memfds. Reserved at boot, the pool cannot be short because
/// memory got fragmented by earlier tests; 16 MiB of the guest's memory.
pub const HUGE_PAGES: u32 = 8;

/// The ACK timeout exponent of rdma-dmabuf's queue pairs in the two-node testbed
/// (`RDMA_DMABUF_ACK_TIMEOUT`): 4.096 µs × 2^19 ≈ 2.1 s per try, against 268 ms by default.
/// A busy host can stop an emulated node for seconds, and its peer must not take that for a
/// dead node.
pub const RC_ACK_TIMEOUT: u8 = 19;

/// The transport retry count there (`RDMA_DMABUF_RETRY_COUNT`, the default's 6): with
/// [`RC_ACK_TIMEOUT`], a request the peer never acknowledges fails after 7 tries, about 15 s
/// on soft-RoCE (60 s by the specification's bound, `QueuePairBuilder::retry_budget`).
pub const RC_RETRY_COUNT: u8 = 6;

/// The udmabuf driver's per-buffer limit in the guests (`udmabuf.size_limit_mb`, built into
/// Debian's kernel; its default is 64): room for the 64 MiB regions of the two-node tests at a
/// page's offset into their buffer.
pub const UDMABUF_LIMIT_MIB: u32 = 128;

/// How long a node may run on after the other node's VM died without recording an exit
/// status (a kernel panic): its command is then most likely waiting on a peer that is gone.
const PEER_GRACE: Duration = Duration::from_secs(30);

/// What one node's run left behind.
pub struct NodeResult {
    /// `a` or `b`.
    pub node: char,
    /// The command's exit status (None: the VM never recorded one).
    pub status: Option<i32>,
    /// Kernel problems (warnings, oopses, taint).
    pub problems: Vec<String>,
    /// Set when the kernel log shows a CPU state no x86 CPU can hold (see
    /// [`klog::emulator_fault`]); the same line is among `problems`.
    pub emulator_fault: Option<String>,
    /// Everything the VM printed on its console.
    pub console: String,
    /// The node's folder in the run folder: kept after a failed [`run`] (its path printed),
    /// removed otherwise, so after a [`run_quiet`] it is gone.
    pub dir: PathBuf,
}

impl NodeResult {
    /// Whether the command exited 0 and the kernel stayed clean.
    pub fn ok(&self) -> bool {
        self.status == Some(0) && self.problems.is_empty()
    }
}

/// Addresses on the testbed's wire (link-local: they never leave the VMs).
pub fn node_addr(node: char, nodes: u8) -> &'static str {
    match (nodes, node) {
        (1, _) => "169.254.20.1",
        (_, 'a') => "169.254.10.1",
        _ => "169.254.10.2",
    }
}

/// Boots the testbed and runs `argv` on every node. Output streams live to stderr.
pub fn run(paths: &Paths, argv: &[String], opts: &Opts) -> Result<Vec<NodeResult>> {
    boot(paths, argv, opts, true)
}

/// As [`run`], but neither streams the console nor reports, and removes the run folder even
/// after a failure: for runs whose caller reads the results and speaks for itself (the
/// harness self-check, which is meant to fail; rdma-core's suite, whose output is long).
pub fn run_quiet(paths: &Paths, argv: &[String], opts: &Opts) -> Result<Vec<NodeResult>> {
    boot(paths, argv, opts, false)
}

/// As [`run`] (or [`run_quiet`] when `loud` is false), but when a node's kernel log shows an
/// emulator fault ([`klog::emulator_fault`]), says so and boots the same command once more.
/// Returns the last boot's results and whether there was a second boot. Only that signature
/// earns the second boot: any other failure is returned as it is.
pub fn run_past_emulator_fault(
    paths: &Paths,
    argv: &[String],
    opts: &Opts,
    loud: bool,
) -> Result<(Vec<NodeResult>, bool)> {
    let first = boot(paths, argv, opts, loud)?;
    let Some((node, fault)) = first
        .iter()
        .find_map(|r| Some((r.node, r.emulator_fault.clone()?)))
    else {
        return Ok((first, false));
    };
    let name = if opts.nodes > 1 {
        format!("node {node}")
    } else {
        "VM".into()
    };
    info(format!("{name}: {fault}"));
    info("booting the same command once more (one second boot, counted in the summary)");
    Ok((boot(paths, argv, opts, loud)?, true))
}

/// What every boot of a run needs before a VM starts.
struct Stack {
    kernel: setup::Kernel,
    initrd: PathBuf,
    /// KVM or TCG, and why.
    accel: Accel,
    /// `None` in stock mode.
    patched: Option<Patched>,
}

/// One node's VM while it runs.
struct Node {
    /// `a` or `b`.
    name: char,
    /// The node's folder in the run folder.
    dir: PathBuf,
    child: Child,
    /// Everything the VM printed so far, filled by `readers`.
    console: Arc<Mutex<String>>,
    /// The threads that copy the VM's stdout and stderr.
    readers: [JoinHandle<()>; 2],
    /// Its VM has not exited yet.
    running: bool,
    /// Its VM was killed at the deadline.
    stopped: bool,
}

/// One boot of the testbed: builds or finds what it needs, starts a VM per node with `argv`
/// as its command, waits for them and collects what each left; `loud` as in [`run`] and
/// [`run_quiet`].
fn boot(paths: &Paths, argv: &[String], opts: &Opts, loud: bool) -> Result<Vec<NodeResult>> {
    check_request(argv, opts)?;
    let stack = prepare(paths, opts)?;
    let cwd = std::env::current_dir()?;
    let run_root = fresh_run_dir(paths)?;
    // Unix socket paths are limited to 108 bytes: keep them short, outside the tree.
    let sock_dir = std::env::temp_dir().join(format!("testbed-{}", std::process::id()));
    std::fs::create_dir_all(&sock_dir)?;

    info(format!(
        "QEMU {}, {}",
        accel::qemu_version(),
        stack.accel.describe()
    ));
    let step = Step::start(banner(&stack, opts));
    let vmlinuz = stack.kernel.vmlinuz();
    let boot = Boot {
        accel: &stack.accel,
        vmlinuz: &vmlinuz,
        initrd: &stack.initrd,
        sock_dir: &sock_dir,
        expose: hidden_paths(&[&paths.root, &paths.target, &cwd]).join(","),
    };
    let mut nodes = Vec::new();
    for name in ['a', 'b'].into_iter().take(opts.nodes.into()) {
        let dir = run_root.join(name.to_string());
        let started = write_node_scripts(&dir, argv, &cwd, name, opts, stack.patched.as_ref())
            .and_then(|()| start(&boot, dir, name, opts, loud));
        match started {
            Ok(node) => nodes.push(node),
            Err(e) => {
                // Node b could not start: node a's VM would otherwise wait for its peer until
                // the deadline, and outlive this process.
                stop_all(&mut nodes);
                let _ = std::fs::remove_dir_all(&sock_dir);
                return Err(e);
            }
        }
    }
    let peer_died = match wait(&mut nodes, opts) {
        Ok(died) => died,
        Err(e) => {
            stop_all(&mut nodes);
            return Err(e);
        }
    };
    step.done();
    let _ = std::fs::remove_dir_all(&sock_dir);

    let results: Vec<NodeResult> = nodes
        .into_iter()
        .map(|n| n.finish(opts, peer_died))
        .collect();
    if loud {
        report(&results, opts.nodes);
    }
    if results.iter().all(NodeResult::ok) || !loud {
        let _ = std::fs::remove_dir_all(&run_root);
    }
    Ok(results)
}

/// Kills and reaps the VMs already started, after a failure that ends the boot.
fn stop_all(nodes: &mut [Node]) {
    for n in nodes {
        let _ = n.child.kill();
        let _ = n.child.wait();
    }
}

/// Refuses an empty command and a node count other than 1 or 2.
fn check_request(argv: &[String], opts: &Opts) -> Result {
    if argv.is_empty() {
        fail!("no command given: cargo xtask vm -- <command> [args...]");
    }
    if !(1..=2).contains(&opts.nodes) {
        fail!("--nodes must be 1 or 2");
    }
    Ok(())
}

/// The guest kernel, its initramfs and, in patched mode, the patched stack (each built on
/// first use, then cached).
fn prepare(paths: &Paths, opts: &Opts) -> Result<Stack> {
    let kernel = setup::kernel(paths)?;
    let initrd = initramfs::build(paths, &kernel)?;
    let patched = match opts.mode {
        Mode::Patched => Some(crate::patched::build(paths, &kernel)?),
        Mode::Stock => None,
    };
    let accel = accel::choose(paths, &kernel, &initrd)?;
    Ok(Stack {
        kernel,
        initrd,
        accel,
        patched,
    })
}

/// The boot step's name: how many VMs, which kernel, which stack.
fn banner(stack: &Stack, opts: &Opts) -> String {
    format!(
        "booting {} testbed VM{} (kernel {}, {} rxe)",
        opts.nodes,
        if opts.nodes > 1 { "s" } else { "" },
        stack.kernel.version,
        if stack.patched.is_some() {
            "patched"
        } else {
            "stock"
        }
    )
}

/// Creates the node's folder `dir` with the command (`cmd.sh`) and `inner.sh`.
fn write_node_scripts(
    dir: &Path,
    argv: &[String],
    cwd: &Path,
    node: char,
    opts: &Opts,
    patched: Option<&Patched>,
) -> Result {
    std::fs::create_dir_all(dir)?;
    // The caller's own command: whatever it runs is the caller's choice, not xtask's, so it is
    // not held to the programs table.
    sh::write(&dir.join("cmd.sh"), &cmd_script(argv))?;
    let inner = inner_script(dir, cwd, node, opts, patched)?;
    programs::write_script(&dir.join("inner.sh"), &inner)
}

/// Starts the node's VM, its console copied by two threads (and streamed to stderr when
/// `loud`).
fn start(boot: &Boot<'_>, dir: PathBuf, name: char, opts: &Opts, loud: bool) -> Result<Node> {
    let mut cmd = qemu(boot, &dir, name, opts);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start qemu-system-x86_64: {e} (run `cargo xtask setup`)"))?;
    let console = Arc::new(Mutex::new(String::new()));
    let prefix = if opts.nodes > 1 {
        format!("[{name}] ")
    } else {
        String::new()
    };
    let readers = [
        pump(child.stdout.take(), prefix.clone(), console.clone(), loud),
        pump(
            child.stderr.take(),
            format!("{prefix}qemu: "),
            console.clone(),
            loud,
        ),
    ];
    Ok(Node {
        name,
        dir,
        child,
        console,
        readers,
        running: true,
        stopped: false,
    })
}

/// Waits until every node's VM has exited; kills those still running at the deadline:
/// `opts.timeout`, or [`PEER_GRACE`] after a VM died without recording an exit status,
/// whichever comes first. Returns whether a VM died so.
fn wait(nodes: &mut [Node], opts: &Opts) -> Result<bool> {
    let mut deadline = Instant::now() + opts.timeout;
    let mut peer_died = false;
    while nodes.iter().any(|n| n.running) {
        for n in nodes.iter_mut().filter(|n| n.running) {
            if n.child.try_wait()?.is_some() {
                n.running = false;
                // No status: the guest died (a panic) before its command finished, so a
                // peer's command may wait on it for as long as its own timeouts allow.
                if !n.dir.join("status").exists() && !peer_died {
                    peer_died = true;
                    deadline = deadline.min(Instant::now() + PEER_GRACE);
                }
            } else if Instant::now() >= deadline {
                let _ = n.child.kill();
                let _ = n.child.wait();
                n.running = false;
                n.stopped = true;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(peer_died)
}

impl Node {
    /// What the exited VM left in its folder and on its console. `peer_died`: whether a
    /// node's VM died without an exit status (from [`wait`]).
    fn finish(self, opts: &Opts, peer_died: bool) -> NodeResult {
        for r in self.readers {
            let _ = r.join();
        }
        let dir = self.dir;
        let status = read_trimmed(&dir.join("status")).and_then(|s| s.parse().ok());
        let dmesg = read_trimmed(&dir.join("dmesg.txt")).unwrap_or_default();
        let taint = read_trimmed(&dir.join("tainted")).and_then(|s| s.parse().ok());
        let console = self.console.lock().map(|c| c.clone()).unwrap_or_default();
        let mut problems = klog::problems(&dmesg, taint);
        // A panicked guest writes no dmesg.txt: its oops is on the console only.
        let emulator_fault =
            klog::emulator_fault(&dmesg).or_else(|| klog::emulator_fault(&console));
        problems.extend(emulator_fault.clone());
        if self.stopped && peer_died {
            problems.push(format!(
                "the run was stopped {PEER_GRACE:?} after the other node's VM died"
            ));
        } else if self.stopped {
            problems.push(format!("the run was stopped after {:?}", opts.timeout));
        }
        NodeResult {
            node: self.name,
            status,
            problems,
            emulator_fault,
            console,
            dir,
        }
    }
}

/// Prints each node's verdict; on a kernel problem, the kernel log too.
fn report(results: &[NodeResult], nodes: u8) {
    for r in results {
        let name = if nodes > 1 {
            format!("node {}", r.node)
        } else {
            "VM".into()
        };
        match r.status {
            Some(s) => info(format!("{name}: command exited with status {s}")),
            None => info(format!(
                "{name}: the command's exit status was not recorded"
            )),
        }
        if !r.problems.is_empty() {
            info(format!("{name}: kernel problems:"));
            for p in &r.problems {
                info(format!("  {p}"));
            }
            if let Some(log) = read_trimmed(&r.dir.join("dmesg.txt")) {
                eprintln!("----- {name} kernel log -----\n{log}\n----- end of kernel log -----");
            }
        }
        if !r.ok() {
            info(format!("{name}: run folder kept at {}", r.dir.display()));
        }
    }
}

/// A new folder for this run under `target/testbed/runs/`, refused when its path has a space,
/// a quote or a comma (it goes unquoted into QEMU's comma-separated options and the kernel
/// command line).
fn fresh_run_dir(paths: &Paths) -> Result<PathBuf> {
    let runs = paths.testbed.join("runs");
    std::fs::create_dir_all(&runs)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let dir = runs.join(format!("{}-{stamp}", std::process::id()));
    let text = dir.to_string_lossy();
    if text.contains(char::is_whitespace) || text.contains(['\'', ',']) {
        fail!("the testbed needs a build folder path without spaces or quotes: {text}");
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `cmd.sh`: the command, each word quoted, run by `exec`.
fn cmd_script(argv: &[String]) -> String {
    let words: Vec<String> = argv.iter().map(|a| sh::quote(a)).collect();
    format!("exec {}\n", words.join(" "))
}

/// The node's `inner.sh`: `scripts/inner.sh` filled in for the run folder `dir` (the node's),
/// the command's working folder `cwd`, and the stack (`None`: stock).
pub(crate) fn inner_script(
    dir: &Path,
    cwd: &Path,
    node: char,
    opts: &Opts,
    patched: Option<&Patched>,
) -> Result<String> {
    let quote = |p: &Path| sh::quote(&p.to_string_lossy());
    let local = node_addr(node, opts.nodes);
    let other = if node == 'a' { 'b' } else { 'a' };
    let (peer, peer_run) = if opts.nodes > 1 {
        (
            node_addr(other, opts.nodes),
            quote(&dir.with_file_name(other.to_string())),
        )
    } else {
        (local, sh::quote(""))
    };
    let (mode, module, exporter, lib) = match patched {
        Some(p) => (
            "patched",
            quote(&p.module),
            quote(&p.exporter),
            quote(&p.lib),
        ),
        None => ("stock", sh::quote(""), sh::quote(""), sh::quote("")),
    };
    let mut env = Vec::new();
    for (k, v) in &opts.env {
        let shell_name = k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !shell_name {
            fail!("environment name {k:?}: letters, digits and _ only, not starting with a digit");
        }
        env.push(format!("export {k}={}", sh::quote(v)));
    }
    script::fill(
        script::INNER,
        &[
            ("RUN", &quote(dir)),
            ("PEER_RUN", &peer_run),
            ("NODES", &opts.nodes.to_string()),
            ("NODE", &node.to_string()),
            ("LOCAL_ADDR", local),
            ("PEER_ADDR", peer),
            ("MODE", mode),
            ("RXE_MODULE", &module),
            ("EXPORTER_MODULE", &exporter),
            ("RDMA_LIB", &lib),
            ("ACK_TIMEOUT", &RC_ACK_TIMEOUT.to_string()),
            ("RETRY_COUNT", &RC_RETRY_COUNT.to_string()),
            ("ENV", &env.join("\n")),
            ("CWD", &quote(cwd)),
        ],
    )
}

/// Paths the VM's tmpfs on /tmp and /run would hide; the initramfs binds them back.
fn hidden_paths(paths: &[&Path]) -> Vec<String> {
    let mut out: Vec<String> = paths
        .iter()
        .filter(|p| p.starts_with("/tmp") || p.starts_with("/run"))
        .map(|p| p.display().to_string())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What every node of one run boots with.
struct Boot<'a> {
    accel: &'a Accel,
    vmlinuz: &'a Path,
    initrd: &'a Path,
    sock_dir: &'a Path,
    /// `testbed.expose=` value: host paths to bind back over the VM's tmpfs.
    expose: String,
}

/// The QEMU command for `node`, whose run folder is `dir`: the second 9p share, and (two
/// nodes) the wire to the other node's unix socket.
fn qemu(boot: &Boot<'_>, dir: &Path, node: char, opts: &Opts) -> Command {
    let Boot {
        vmlinuz,
        initrd,
        sock_dir,
        ..
    } = *boot;
    let mut c = programs::cmd("qemu-system-x86_64");
    let smp = if opts.nodes > 1 { 1 } else { 2 };
    c.args(["-machine", "q35"])
        .args(boot.accel.qemu_args())
        .args(["-smp", &smp.to_string(), "-m", &opts.mem_mib.to_string()])
        .args(["-display", "none", "-serial", "stdio", "-monitor", "none"])
        .args(["-no-reboot", "-kernel"])
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 loglevel=1 panic=-1 hugepages={HUGE_PAGES} \
             udmabuf.size_limit_mb={UDMABUF_LIMIT_MIB} testbed.node={node} \
             testbed.run={} testbed.expose={} {} {}",
            dir.display(),
            boot.expose,
            boot.accel.kernel_args(),
            std::env::var(EXTRA_CMDLINE).unwrap_or_default()
        ))
        .arg("-virtfs")
        .arg("local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap")
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=out,security_model=none,multidevs=remap",
            dir.display()
        ));
    if opts.nodes > 1 {
        let (me, peer) = if node == 'a' { ("a", "b") } else { ("b", "a") };
        let sock = |n: &str| sock_dir.join(format!("{n}.sock")).display().to_string();
        c.arg("-netdev")
            .arg(format!(
                "dgram,id=wire,local.type=unix,local.path={},remote.type=unix,remote.path={}",
                sock(me),
                sock(peer)
            ))
            .arg("-device")
            .arg(format!(
                "virtio-net-pci,netdev=wire,mac=52:54:00:00:00:0{}",
                if node == 'a' { 1 } else { 2 }
            ));
    } else {
        c.args(["-nic", "none"]);
    }
    c
}

/// Copies a child's output into `sink`, and to stderr (with `prefix`) when `loud`.
fn pump(
    stream: Option<impl std::io::Read + Send + 'static>,
    prefix: String,
    sink: Arc<Mutex<String>>,
    loud: bool,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let Some(stream) = stream else { return };
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        while reader.read_until(b'\n', &mut buf).unwrap_or(0) > 0 {
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim_end_matches(['\n', '\r']);
            if loud {
                let _ = writeln!(std::io::stderr().lock(), "{prefix}{line}");
            }
            if let Ok(mut s) = sink.lock() {
                s.push_str(line);
                s.push('\n');
            }
            buf.clear();
        }
    })
}

/// The text of the file at `path` without surrounding whitespace, if it can be read.
fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_names_must_be_shell_names() {
        for bad in ["", "1A", "A B", "A;rm", "A=B"] {
            let opts = Opts {
                env: vec![(bad.into(), "v".into())],
                ..Opts::default()
            };
            let e = inner_script(Path::new("/r"), Path::new("/c"), 'a', &opts, None);
            assert!(e.is_err(), "{bad:?} accepted");
        }
        let opts = Opts {
            env: vec![("_OK_1".into(), "a b".into())],
            ..Opts::default()
        };
        let s = inner_script(Path::new("/r"), Path::new("/c"), 'a', &opts, None).unwrap();
        assert!(s.contains("export _OK_1='a b'"), "{s}");
    }

    #[test]
    fn a_failed_boot_stops_the_vms_already_started() {
        let child = crate::programs::cmd("sleep")
            .arg("60")
            .spawn()
            .expect("sleep stands in for a VM");
        let mut nodes = vec![Node {
            name: 'a',
            dir: PathBuf::new(),
            child,
            console: Arc::new(Mutex::new(String::new())),
            readers: [std::thread::spawn(|| {}), std::thread::spawn(|| {})],
            running: true,
            stopped: false,
        }];
        stop_all(&mut nodes);
        let exited = nodes[0].child.try_wait().expect("try_wait");
        assert!(exited.is_some(), "the started VM is still running");
    }
}
