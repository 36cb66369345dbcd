//! Boots the testbed (one VM, or two joined by a virtual wire) and runs a command inside,
//! chrooted into the host's root so host-built binaries run unchanged (`dmabuf-testbed run`,
//! `cargo xtask vm`). The VMs' processes and their consoles are in `vm/node.rs`; how host
//! paths reach the guest is in [`share`].

mod inner;
mod node;
pub mod share;
pub mod topology;

use crate::accel::{self, Accel};
use crate::patched::Patched;
use crate::sh::{self, Result};
use crate::ui::{info, Step};
use crate::{fail, initramfs, kernel, programs, Cache};
pub use inner::inner_script;
use node::{report, start, stop_all, wait, Boot};
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// NICs (rails) per node, 1 to [`MAX_NICS`]: rail i is `rxe<i>` on its own link (its own
    /// wire between two nodes, its own veth pair on one) in its own subnet
    /// ([`rail_addr`]).
    pub nics: u8,
    /// A PCIe tree with two NUMA nodes, a GPU (`virtio-gpu-pci`) behind a PCIe switch and the
    /// NICs placed at every distance from it ([`topology`]); two nodes only.
    pub topology: bool,
    /// The whole run is stopped (and fails) after this long.
    pub timeout: Duration,
    /// Extra environment for the command.
    pub env: Vec<(String, String)>,
    /// Guest memory per VM, in MiB.
    pub mem_mib: u32,
    /// Host folders under `/tmp` or `/run` the command needs besides its working folder and
    /// the cache (the VM has its own tmpfs there; these are bound back, read-only).
    pub expose: Vec<PathBuf>,
    /// Share the command's working folder writable (a 9p export of its own) instead of
    /// read-only through the host's root.
    pub writable_cwd: bool,
    /// Debian packages to add to the guest's root ([`crate::packages`]).
    pub packages: Vec<String>,
    /// Print the accelerator's whole story (QEMU's words from the KVM probe) in the run's
    /// header, not its one-line summary.
    pub verbose: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            mode: Mode::Patched,
            nodes: 1,
            nics: 1,
            topology: false,
            timeout: Duration::from_secs(1800),
            env: Vec::new(),
            mem_mib: 2048,
            expose: Vec::new(),
            writable_cwd: false,
            packages: Vec::new(),
            verbose: false,
        }
    }
}

/// Environment variable whose value is appended to the guests' kernel command line, for
/// debugging (e.g. `slub_debug=FZPU loglevel=7`).
pub const EXTRA_CMDLINE: &str = "TESTBED_KERNEL_ARGS";

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

/// The retry settings the two-node guests give rdma-dmabuf, with the bound they set: a
/// request a silent peer never acknowledges fails within (retries + 1) × 4 × 4.096 µs ×
/// 2^timeout by the specification (soft-RoCE takes about a quarter of it).
pub fn retry_settings() -> String {
    let per_try_s = 4.0 * 4.096e-6 * f64::from(1u32 << RC_ACK_TIMEOUT);
    let bound_s = per_try_s * f64::from(u32::from(RC_RETRY_COUNT) + 1);
    format!(
        "rdma-dmabuf retries in the guests: RDMA_DMABUF_ACK_TIMEOUT={RC_ACK_TIMEOUT} \
         RDMA_DMABUF_RETRY_COUNT={RC_RETRY_COUNT}: a request the peer never acknowledges fails \
         within {bound_s:.0} s (the specification's bound; about {:.0} s on soft-RoCE)",
        bound_s / 4.0
    )
}

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
    /// [`crate::klog::emulator_fault`]); the same line is among `problems`.
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

/// The most NICs (rails) a node can have (`--nics`).
pub const MAX_NICS: u8 = 4;

/// `node`'s address on rail `rail`: rail 0 is [`node_addr`]; rail i the same host number
/// in the next subnets (`169.254.10+i.x` between two nodes, `169.254.20+i.1` on one).
pub fn rail_addr(node: char, nodes: u8, rail: u8) -> String {
    let (subnet, host) = match (nodes, node) {
        (1, _) => (20, 1),
        (_, 'a') => (10, 1),
        _ => (10, 2),
    };
    format!("169.254.{}.{host}", subnet + u16::from(rail))
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
pub fn run(cache: &Cache, argv: &[String], opts: &Opts) -> Result<Vec<NodeResult>> {
    boot(cache, argv, opts, true)
}

/// As [`run`], but neither streams the console nor reports, and removes the run folder even
/// after a failure: for runs whose caller reads the results and speaks for itself (the
/// harness self-check, which is meant to fail; rdma-core's suite, whose output is long).
pub fn run_quiet(cache: &Cache, argv: &[String], opts: &Opts) -> Result<Vec<NodeResult>> {
    boot(cache, argv, opts, false)
}

/// As [`run`] (or [`run_quiet`] when `loud` is false), but when a node's kernel log shows an
/// emulator fault ([`crate::klog::emulator_fault`]), says so and boots the same command once more.
/// Returns the last boot's results and whether there was a second boot. Only that signature
/// earns the second boot: any other failure is returned as it is.
pub fn run_past_emulator_fault(
    cache: &Cache,
    argv: &[String],
    opts: &Opts,
    loud: bool,
) -> Result<(Vec<NodeResult>, bool)> {
    let first = boot(cache, argv, opts, loud)?;
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
    Ok((boot(cache, argv, opts, loud)?, true))
}

/// What every boot of a run needs before a VM starts.
struct Stack {
    kernel: kernel::Kernel,
    initrd: PathBuf,
    /// KVM or TCG, and why.
    accel: Accel,
    /// `None` in stock mode.
    patched: Option<Patched>,
    /// The unpacked extra packages' root, if any were asked for.
    packages: Option<PathBuf>,
}

/// One boot of the testbed: builds or finds what it needs, starts a VM per node with `argv`
/// as its command, waits for them and collects what each left; `loud` as in [`run`] and
/// [`run_quiet`].
fn boot(cache: &Cache, argv: &[String], opts: &Opts, loud: bool) -> Result<Vec<NodeResult>> {
    check_request(argv, opts)?;
    let cwd = shareable_cwd(opts)?;
    // The cache's folders are named in the guest's scripts: refused before anything is built.
    share::utf8(share::one_line(&cache.dir)?)?;
    let stack = prepare(cache, opts)?;
    let run_root = fresh_run_dir(cache)?;
    // Unix socket paths are limited to 108 bytes: keep them short, outside the tree.
    let sock_dir = std::env::temp_dir().join(format!("testbed-{}", std::process::id()));
    std::fs::create_dir_all(&sock_dir)?;

    info(format!(
        "QEMU {}, {}",
        accel::qemu_version(),
        if opts.verbose {
            stack.accel.describe()
        } else {
            stack.accel.summary()
        }
    ));
    if opts.nodes > 1 {
        info(retry_settings());
    }
    let step = Step::check(banner(&stack, opts));
    let vmlinuz = stack.kernel.vmlinuz();
    let boot = Boot {
        accel: &stack.accel,
        vmlinuz: &vmlinuz,
        initrd: &stack.initrd,
        sock_dir: &sock_dir,
        expose: {
            let mut shown: Vec<&Path> = opts.expose.iter().map(PathBuf::as_path).collect();
            shown.extend([cache.dir.as_path(), &cwd]);
            shown.extend(stack.packages.as_deref());
            hidden_paths(&shown)
        },
        cwd: opts.writable_cwd.then_some(cwd.as_path()),
        packages: stack.packages.as_deref(),
    };
    let mut nodes = Vec::new();
    for name in ['a', 'b'].into_iter().take(opts.nodes.into()) {
        let dir = run_root.join(name.to_string());
        let started = write_node_files(&dir, argv, &boot, &cwd, name, opts, &stack)
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

/// The command's working folder (the current one), refused when the guest cannot be given
/// it ([`share::Unsharable`]); `dmabuf-testbed run` asks this before anything is built or
/// installed.
///
/// # Errors
/// The current folder cannot be read, or its path has a newline (or, with `opts.expose`,
/// one of those paths has), or it would be shared writable and is the root or a system
/// folder ([`share::writable`]).
pub fn shareable_cwd(opts: &Opts) -> Result<PathBuf> {
    let cwd = std::env::current_dir()?;
    share::one_line(&cwd)?;
    if opts.writable_cwd {
        share::writable(&cwd)?;
    }
    for p in &opts.expose {
        share::one_line(p)?;
    }
    Ok(cwd)
}

/// Refuses an empty command and a node count other than 1 or 2.
fn check_request(argv: &[String], opts: &Opts) -> Result {
    if argv.is_empty() {
        fail!("no command given: run -- <command> [args...]");
    }
    if !(1..=2).contains(&opts.nodes) {
        fail!("--nodes must be 1 or 2");
    }
    if opts.topology && opts.nodes != 2 {
        fail!("--topology needs --nodes 2 (one node's NICs are veth pairs, on no PCIe bus)");
    }
    Ok(())
}

/// The guest kernel, its initramfs and, in patched mode, the patched stack (each built on
/// first use, then cached).
fn prepare(cache: &Cache, opts: &Opts) -> Result<Stack> {
    let kernel = kernel::fetch(cache)?;
    let initrd = initramfs::build(cache, &kernel)?;
    let patched = match opts.mode {
        Mode::Patched => Some(crate::patched::build(cache, &kernel)?),
        Mode::Stock => None,
    };
    let accel = accel::choose(cache, &kernel, &initrd)?;
    let packages = crate::packages::unpack(cache, &opts.packages)?;
    Ok(Stack {
        kernel,
        initrd,
        accel,
        patched,
        packages,
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

/// Creates the node's folder `dir` with the command (`cmd.sh`), `inner.sh` and the host
/// paths `/init` reads ([`PATHS_FILE`]); `cwd`: where the command starts.
fn write_node_files(
    dir: &Path,
    argv: &[String],
    boot: &Boot<'_>,
    cwd: &Path,
    node: char,
    opts: &Opts,
    stack: &Stack,
) -> Result {
    let patched = stack.patched.as_ref();
    std::fs::create_dir_all(dir)?;
    // The caller's own command: whatever it runs is the caller's choice, not xtask's, so it is
    // not held to the programs table.
    sh::write(&dir.join("cmd.sh"), &cmd_script(argv))?;
    let inner = inner_script(dir, node, opts, patched, &stack.kernel.root)?;
    programs::write_script(&dir.join("inner.sh"), &inner)?;
    let preload = patched.map(Patched::libibverbs);
    let paths = guest_paths(boot, dir, cwd, preload.as_deref())?;
    std::fs::write(dir.join(PATHS_FILE), paths)
        .map_err(|e| format!("cannot write {}: {e}", dir.join(PATHS_FILE).display()))?;
    Ok(())
}

/// The file in each node's run folder that tells `/init` the host paths of the run (the
/// kernel command line carries none): `key=path` lines ([`share::lines`]) with the keys
/// `run` (the node's run folder, where `/init` binds the `out` share), `start` (the command's
/// working folder), `cwd` (the same, when shared writable), `pkgs` (the extra packages' root),
/// `preload` (the patched `libibverbs.so.1`, which `/init` names in the guest's
/// `/etc/ld.so.preload`) and `expose` (once per host folder bound back over the guest's tmpfs).
pub const PATHS_FILE: &str = "paths";

/// The text of [`PATHS_FILE`] for the node whose run folder is `dir`, the command starting
/// in `cwd`; `preload`: the library every program of the guest loads first (patched mode).
fn guest_paths(boot: &Boot<'_>, dir: &Path, cwd: &Path, preload: Option<&Path>) -> Result<Vec<u8>> {
    let mut entries = vec![("run", dir), ("start", cwd)];
    entries.extend(boot.cwd.map(|c| ("cwd", c)));
    entries.extend(boot.packages.map(|p| ("pkgs", p)));
    entries.extend(preload.map(|p| ("preload", p)));
    entries.extend(boot.expose.iter().map(|p| ("expose", p.as_path())));
    Ok(share::lines(&entries)?)
}

/// A new folder for this run under the cache's `runs/`. Its path goes into the guest's
/// scripts, so it must be one line of UTF-8 ([`share::Unsharable`] otherwise); any other
/// character is carried escaped.
fn fresh_run_dir(cache: &Cache) -> Result<PathBuf> {
    let runs = cache.dir.join("runs");
    std::fs::create_dir_all(&runs)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let dir = runs.join(format!("{}-{stamp}", std::process::id()));
    share::utf8(share::one_line(&dir)?)?;
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `cmd.sh`: the command, each word quoted, run by `exec`.
fn cmd_script(argv: &[String]) -> String {
    let words: Vec<String> = argv.iter().map(|a| sh::quote(a)).collect();
    format!("exec {}\n", words.join(" "))
}

/// Paths the VM's tmpfs on /tmp and /run would hide; the initramfs binds them back.
fn hidden_paths(paths: &[&Path]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = paths
        .iter()
        .filter(|p| p.starts_with("/tmp") || p.starts_with("/run"))
        .map(|p| p.to_path_buf())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rail 0 is the node's address; rail i is the same host in the i-th next subnet.
    #[test]
    fn rail_addresses_extend_the_node_addresses() {
        for (node, nodes) in [('a', 1), ('a', 2), ('b', 2)] {
            assert_eq!(rail_addr(node, nodes, 0), node_addr(node, nodes));
        }
        assert_eq!(rail_addr('b', 2, 3), "169.254.13.2");
        assert_eq!(rail_addr('a', 1, 2), "169.254.22.1");
    }

    #[test]
    fn the_retry_bound_is_stated_and_accepted_by_the_library() {
        let s = retry_settings();
        assert!(
            s.contains("ACK_TIMEOUT=19") && s.contains("within 60 s"),
            "{s}"
        );
        // rdma-dmabuf's environment accepts 1 to 22 and 0 to 6 (MAX_ENV_ACK_TIMEOUT,
        // MAX_ENV_RETRY_COUNT); a value outside would fail every queue pair's build.
        assert!((1..=22).contains(&RC_ACK_TIMEOUT) && RC_RETRY_COUNT <= 6);
    }

    #[test]
    fn the_paths_file_names_every_share_one_a_line() {
        let accel = Accel {
            kvm: false,
            cpu: "max".into(),
            why: String::new(),
            brief: String::new(),
        };
        let cwd = Path::new("/tmp/w,path=/x y");
        let boot = Boot {
            accel: &accel,
            vmlinuz: Path::new("/c/vmlinuz"),
            initrd: Path::new("/c/initrd"),
            sock_dir: Path::new("/tmp/s"),
            expose: hidden_paths(&[cwd, Path::new("/c"), Path::new("/run/p")]),
            cwd: Some(cwd),
            packages: Some(Path::new("/c/pkgs")),
        };
        let lib = Path::new("/c/p 1/lib/libibverbs.so.1");
        let text = guest_paths(&boot, Path::new("/c/runs/1/a"), cwd, Some(lib)).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "run=/c/runs/1/a\nstart=/tmp/w,path=/x y\ncwd=/tmp/w,path=/x y\npkgs=/c/pkgs\n\
             preload=/c/p 1/lib/libibverbs.so.1\nexpose=/run/p\nexpose=/tmp/w,path=/x y\n"
        );
        let bad = Path::new("/tmp/a\nb");
        let e = guest_paths(&boot, Path::new("/c/runs/1/a"), bad, None).unwrap_err();
        assert!(e.to_string().contains("newline (U+000A)"), "{e}");
    }
}
