//! `cargo xtask vm`: boots the testbed (one VM, or two joined by a virtual wire) and runs a
//! command inside, chrooted into the host's root so host-built binaries run unchanged.

use crate::sh::{self, Result};
use crate::ui::{info, Step};
use crate::{fail, initramfs, klog, programs, setup, Paths};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
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
    /// The run's folder (kept when the run failed).
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

/// As [`run`], but neither streams the console nor reports: for runs expected to fail.
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

fn boot(paths: &Paths, argv: &[String], opts: &Opts, loud: bool) -> Result<Vec<NodeResult>> {
    if argv.is_empty() {
        fail!("no command given: cargo xtask vm -- <command> [args...]");
    }
    if !(1..=2).contains(&opts.nodes) {
        fail!("--nodes must be 1 or 2");
    }
    let kernel = setup::kernel(paths)?;
    let initrd = initramfs::build(paths, &kernel)?;
    let patched = match opts.mode {
        Mode::Patched => Some(crate::patched::build(paths, &kernel)?),
        Mode::Stock => None,
    };
    let cwd = std::env::current_dir()?;
    let run_root = fresh_run_dir(paths)?;
    let nodes: Vec<char> = ['a', 'b'][..opts.nodes as usize].to_vec();
    // Unix socket paths are limited to 108 bytes: keep them short, outside the tree.
    let sock_dir = std::env::temp_dir().join(format!("testbed-{}", std::process::id()));
    std::fs::create_dir_all(&sock_dir)?;

    let step = Step::start(format!(
        "booting {} testbed VM{} (kernel {}, {} rxe)",
        opts.nodes,
        if opts.nodes > 1 { "s" } else { "" },
        kernel.version,
        if patched.is_some() {
            "patched"
        } else {
            "stock"
        }
    ));
    let vmlinuz = kernel.vmlinuz();
    let boot = Boot {
        vmlinuz: &vmlinuz,
        initrd: &initrd,
        sock_dir: &sock_dir,
        expose: hidden_paths(&[&paths.root, &paths.target, &cwd]).join(","),
    };
    let mut children = Vec::new();
    for &node in &nodes {
        let dir = run_root.join(node.to_string());
        std::fs::create_dir_all(&dir)?;
        sh::write(&dir.join("cmd.sh"), &cmd_script(argv))?;
        programs::write_script(
            &dir.join("inner.sh"),
            &inner_script(&dir, &cwd, node, opts, patched.as_ref()),
        )?;
        let mut cmd = qemu(&boot, &dir, node, opts);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                format!("cannot start qemu-system-x86_64: {e} (run `cargo xtask setup`)")
            })?;
        let console = Arc::new(Mutex::new(String::new()));
        let prefix = if opts.nodes > 1 {
            format!("[{node}] ")
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
        children.push((node, dir, child, console, readers));
    }

    let mut deadline = Instant::now() + opts.timeout;
    let mut stopped = vec![false; children.len()];
    let mut running = vec![true; children.len()];
    let mut peer_died = false;
    while running.contains(&true) {
        for (i, (_, dir, child, _, _)) in children.iter_mut().enumerate() {
            if !running[i] {
                continue;
            }
            if child.try_wait()?.is_some() {
                running[i] = false;
                // No status: the guest died (a panic) before its command finished, so a
                // peer's command may wait on it for as long as its own timeouts allow.
                if !dir.join("status").exists() && !peer_died {
                    peer_died = true;
                    deadline = deadline.min(Instant::now() + PEER_GRACE);
                }
            } else if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                running[i] = false;
                stopped[i] = true;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    step.done();
    let _ = std::fs::remove_dir_all(&sock_dir);

    let mut results = Vec::new();
    for ((node, dir, _child, console, readers), stopped) in children.into_iter().zip(stopped) {
        for r in readers {
            let _ = r.join();
        }
        let status = read_trimmed(&dir.join("status")).and_then(|s| s.parse().ok());
        let dmesg = read_trimmed(&dir.join("dmesg.txt")).unwrap_or_default();
        let taint = read_trimmed(&dir.join("tainted")).and_then(|s| s.parse().ok());
        let console = console.lock().map(|c| c.clone()).unwrap_or_default();
        let mut problems = klog::problems(&dmesg, taint);
        // A panicked guest writes no dmesg.txt: its oops is on the console only.
        let emulator_fault =
            klog::emulator_fault(&dmesg).or_else(|| klog::emulator_fault(&console));
        problems.extend(emulator_fault.clone());
        if stopped && peer_died {
            problems.push(format!(
                "the run was stopped {PEER_GRACE:?} after the other node's VM died"
            ));
        } else if stopped {
            problems.push(format!("the run was stopped after {:?}", opts.timeout));
        }
        results.push(NodeResult {
            node,
            status,
            problems,
            emulator_fault,
            console,
            dir,
        });
    }
    if loud {
        report(&results, opts.nodes);
    }
    if results.iter().all(NodeResult::ok) || !loud {
        let _ = std::fs::remove_dir_all(&run_root);
    }
    Ok(results)
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

fn cmd_script(argv: &[String]) -> String {
    let words: Vec<String> = argv.iter().map(|a| sh::quote(a)).collect();
    format!("exec {}\n", words.join(" "))
}

pub(crate) fn inner_script(
    dir: &Path,
    cwd: &Path,
    node: char,
    opts: &Opts,
    patched: Option<&crate::patched::Patched>,
) -> String {
    let (stack, check) = match patched {
        Some(p) => crate::patched::inner_setup(p),
        None => ("export TESTBED_MODE=stock\n".to_string(), String::new()),
    };
    let run = dir.to_string_lossy();
    let local = node_addr(node, opts.nodes);
    let peer = if opts.nodes > 1 {
        node_addr(if node == 'a' { 'b' } else { 'a' }, opts.nodes)
    } else {
        local
    };
    let mut env = String::new();
    for (k, v) in &opts.env {
        env.push_str(&format!("export {k}={}\n", sh::quote(v)));
    }
    let netdev = if opts.nodes > 1 {
        "NETDEV=eth0\n".to_string()
    } else {
        "NETDEV=veth0\nip link add veth0 type veth peer name veth1 && ip link set veth1 up\n".into()
    };
    let wait_peer = if opts.nodes > 1 {
        "n=0\nuntil ping -c1 -W1 \"$PEER_ADDR\" >/dev/null 2>&1; do\n    n=$((n+1)); [ $n -gt 120 ] && fatal \"peer $PEER_ADDR unreachable\"\ndone\n"
    } else {
        ""
    };
    format!(
        r#"# Generated by cargo xtask vm: network, rxe device, then the command.
set -u
RUN={run}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp
export TESTBED_VM=1 TESTBED_NODES={nodes} NODE={node} RDMA_DEVICE=rxe0
export LOCAL_ADDR={local} PEER_ADDR={peer}
{env}say() {{ echo "testbed[$NODE]: $*"; }}
fatal() {{ say "$*"; echo 125 > "$RUN/status"; exit 125; }}
ip link set lo up
{netdev}ip addr add "$LOCAL_ADDR/24" dev "$NETDEV" || fatal "no $NETDEV"
ip link set "$NETDEV" up
{stack}rdma link add rxe0 type rxe netdev "$NETDEV" || fatal "rdma link add failed"
P=/sys/class/infiniband/rxe0/ports/1
gid_index() {{
    for g in "$P"/gids/*; do
        i=${{g##*/}}
        case "$(cat "$g")" in
        0000:0000:0000:0000:0000:ffff:*)
            [ "$(cat "$P/gid_attrs/types/$i" 2>/dev/null)" = "RoCE v2" ] && {{ echo "$i"; return 0; }} ;;
        esac
    done
    return 1
}}
n=0
until grep -q ACTIVE "$P/state" 2>/dev/null && RDMA_GID_INDEX=$(gid_index); do
    n=$((n+1)); [ $n -gt 200 ] && fatal "rxe0 did not become ACTIVE with a RoCE v2 IPv4 GID"
    sleep 0.05
done
export RDMA_GID_INDEX NETDEV
{check}{wait_peer}cd {cwd} || fatal "no working folder"
sh "$RUN/cmd.sh"
echo $? > "$RUN/status"
"#,
        nodes = opts.nodes,
        cwd = sh::quote(&cwd.to_string_lossy()),
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
    vmlinuz: &'a Path,
    initrd: &'a Path,
    sock_dir: &'a Path,
    /// `testbed.expose=` value: host paths to bind back over the VM's tmpfs.
    expose: String,
}

fn qemu(boot: &Boot<'_>, dir: &Path, node: char, opts: &Opts) -> Command {
    let Boot {
        vmlinuz,
        initrd,
        sock_dir,
        ..
    } = *boot;
    let mut c = programs::cmd("qemu-system-x86_64");
    let smp = if opts.nodes > 1 { 1 } else { 2 };
    c.args(["-machine", "q35", "-cpu", "max", "-accel", "tcg"])
        .args(["-smp", &smp.to_string(), "-m", &opts.mem_mib.to_string()])
        .args(["-display", "none", "-serial", "stdio", "-monitor", "none"])
        .args(["-no-reboot", "-kernel"])
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 loglevel=1 panic=-1 testbed.node={node} testbed.run={} \
             testbed.expose={} {}",
            dir.display(),
            boot.expose,
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

/// Copies a child's output to stderr (with `prefix`) and into `sink`.
fn pump(
    stream: Option<impl std::io::Read + Send + 'static>,
    prefix: String,
    sink: Arc<Mutex<String>>,
    loud: bool,
) -> std::thread::JoinHandle<()> {
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

/// Waits for `child` until `deadline`; kills it then. Returns whether it timed out.
fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}
