//! The testbed's VMs while they run: QEMU's command line, the consoles, the deadline, and what
//! each VM left in its run folder.

use super::{NodeResult, Opts, EXTRA_CMDLINE, HUGE_PAGES, PEER_GRACE, UDMABUF_LIMIT_MIB};
use crate::accel::Accel;
use crate::sh::Result;
use crate::ui::info;
use crate::{klog, programs};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One node's VM while it runs.
pub(super) struct Node {
    /// `a` or `b`.
    pub(super) name: char,
    /// The node's folder in the run folder.
    pub(super) dir: PathBuf,
    pub(super) child: Child,
    /// Everything the VM printed so far, filled by `readers`.
    pub(super) console: Arc<Mutex<String>>,
    /// The threads that copy the VM's stdout and stderr.
    pub(super) readers: [JoinHandle<()>; 2],
    /// Its VM has not exited yet.
    pub(super) running: bool,
    /// Its VM was killed at the deadline.
    pub(super) stopped: bool,
}

/// Kills and reaps the VMs already started, after a failure that ends the boot.
pub(super) fn stop_all(nodes: &mut [Node]) {
    for n in nodes {
        let _ = n.child.kill();
        let _ = n.child.wait();
    }
}

/// Starts the node's VM, its console copied by two threads (and streamed to stderr when
/// `loud`).
pub(super) fn start(
    boot: &Boot<'_>,
    dir: PathBuf,
    name: char,
    opts: &Opts,
    loud: bool,
) -> Result<Node> {
    let mut cmd = qemu(boot, &dir, name, opts);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start qemu-system-x86_64: {e} (run `dmabuf-testbed setup` or `cargo xtask setup`)"))?;
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
pub(super) fn wait(nodes: &mut [Node], opts: &Opts) -> Result<bool> {
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
    pub(super) fn finish(self, opts: &Opts, peer_died: bool) -> NodeResult {
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
pub(super) fn report(results: &[NodeResult], nodes: u8) {
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

/// What every node of one run boots with.
pub(super) struct Boot<'a> {
    pub(super) accel: &'a Accel,
    pub(super) vmlinuz: &'a Path,
    pub(super) initrd: &'a Path,
    pub(super) sock_dir: &'a Path,
    /// `testbed.expose=` value: host paths to bind back over the VM's tmpfs.
    pub(super) expose: String,
    /// The command's working folder, when it is shared writable (`testbed.cwd=`).
    pub(super) cwd: Option<&'a Path>,
    /// The unpacked extra packages' root, laid over the host's (`testbed.pkgs=`).
    pub(super) packages: Option<&'a Path>,
}

/// The QEMU command for `node`, whose run folder is `dir`: the second 9p share, and (two
/// nodes) the wire to the other node's unix socket.
pub(super) fn qemu(boot: &Boot<'_>, dir: &Path, node: char, opts: &Opts) -> Command {
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
             testbed.run={} testbed.expose={} testbed.cwd={} testbed.pkgs={} {} {}",
            dir.display(),
            boot.expose,
            boot.cwd
                .map(Path::display)
                .map(|d| d.to_string())
                .unwrap_or_default(),
            boot.packages
                .map(Path::display)
                .map(|d| d.to_string())
                .unwrap_or_default(),
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
    if let Some(pkgs) = boot.packages {
        // A share of its own: overlayfs refuses layers that lie inside one another.
        c.arg("-virtfs").arg(format!(
            "local,path={},mount_tag=pkgs,security_model=none,readonly=on,multidevs=remap",
            pkgs.display()
        ));
    }
    if let Some(cwd) = boot.cwd {
        c.arg("-virtfs").arg(format!(
            "local,path={},mount_tag=cwd,security_model=none,multidevs=remap",
            cwd.display()
        ));
    }
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
pub(super) fn pump(
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
pub(super) fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

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
