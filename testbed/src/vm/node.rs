//! The testbed's VMs while they run: QEMU's command line, the consoles, the deadline, and what
//! each VM left in its run folder.

use super::{
    share, topology, NodeResult, Opts, EXTRA_CMDLINE, HUGE_PAGES, PEER_GRACE, UDMABUF_LIMIT_MIB,
};
use crate::accel::Accel;
use crate::sh::Result;
use crate::ui::info;
use crate::{klog, programs};
use std::ffi::OsString;
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
    /// Host paths to bind back over the VM's tmpfs (`expose=` lines of the paths file).
    pub(super) expose: Vec<PathBuf>,
    /// The command's working folder, when it is shared writable (the `cwd` share).
    pub(super) cwd: Option<&'a Path>,
    /// The unpacked extra packages' root, laid over the host's (the `pkgs` share).
    pub(super) packages: Option<&'a Path>,
}

/// The QEMU command for `node`, whose run folder is `dir`: the second 9p share, and (two
/// nodes) the wire to the other node's unix socket. Host paths go only into QEMU's option
/// values, escaped ([`share::qemu_value`]); the kernel command line carries none (`/init`
/// reads them from the run folder, [`super::PATHS_FILE`]).
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
             udmabuf.size_limit_mb={UDMABUF_LIMIT_MIB} testbed.node={node} {} {}",
            boot.accel.kernel_args(),
            std::env::var(EXTRA_CMDLINE).unwrap_or_default()
        ))
        .arg("-virtfs")
        .arg(virtfs(Path::new("/"), "host", true))
        .arg("-virtfs")
        .arg(virtfs(dir, "out", false));
    if let Some(pkgs) = boot.packages {
        // A share of its own: overlayfs refuses layers that lie inside one another.
        c.arg("-virtfs").arg(virtfs(pkgs, "pkgs", true));
    }
    if let Some(cwd) = boot.cwd {
        c.arg("-virtfs").arg(virtfs(cwd, "cwd", false));
    }
    if opts.topology {
        c.args(topology::qemu_args(opts.mem_mib));
    }
    if opts.nodes > 1 {
        let (me, peer) = if node == 'a' { ("a", "b") } else { ("b", "a") };
        // Rail 0's wire keeps its names (`wire`, `a.sock`); rail i's are `wire<i>`, `a<i>.sock`.
        for rail in 0..opts.nics.max(1) {
            let tag = if rail == 0 {
                String::new()
            } else {
                rail.to_string()
            };
            let sock =
                |n: &str| share::qemu_value(sock_dir.join(format!("{n}{tag}.sock")).as_os_str());
            let mut wire =
                OsString::from(format!("dgram,id=wire{tag},local.type=unix,local.path="));
            wire.push(sock(me));
            wire.push(",remote.type=unix,remote.path=");
            wire.push(sock(peer));
            let place = if opts.topology {
                topology::nic_props(rail)
            } else {
                String::new()
            };
            c.arg("-netdev").arg(wire).arg("-device").arg(format!(
                "virtio-net-pci,netdev=wire{tag},mac=52:54:00:00:{rail:02x}:0{}{place}",
                if node == 'a' { 1 } else { 2 }
            ));
        }
    } else {
        c.args(["-nic", "none"]);
    }
    c
}

/// The `-virtfs` value that shares the host folder `path` under the 9p tag `tag`.
fn virtfs(path: &Path, tag: &str, readonly: bool) -> OsString {
    let mut v = OsString::from("local,path=");
    v.push(share::qemu_value(path.as_os_str()));
    v.push(format!(
        ",mount_tag={tag},security_model=none{},multidevs=remap",
        if readonly { ",readonly=on" } else { "" }
    ));
    v
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
    use std::os::unix::ffi::OsStrExt;

    /// QEMU's arguments for a two-node boot from an odd working folder, packages folder and
    /// temporary folder.
    fn odd_args() -> (Vec<Vec<u8>>, &'static [u8]) {
        let cwd: &'static [u8] = b"/t/work,path=/t/sibling 'q' \"d\" $x \\ * =\xff";
        let accel = Accel {
            kvm: false,
            cpu: "max".into(),
            why: String::new(),
            brief: String::new(),
        };
        let cwd_path = Path::new(std::ffi::OsStr::from_bytes(cwd));
        let boot = Boot {
            accel: &accel,
            vmlinuz: Path::new("/c/vmlinuz"),
            initrd: Path::new("/c/initrd"),
            sock_dir: Path::new("/tmp,x/testbed-1"),
            expose: vec![cwd_path.to_path_buf()],
            cwd: Some(cwd_path),
            packages: Some(Path::new("/c/pk,gs")),
        };
        let opts = Opts {
            nodes: 2,
            ..Opts::default()
        };
        let cmd = qemu(&boot, Path::new("/c/runs/1,2/a"), 'a', &opts);
        let args = cmd.get_args().map(|a| a.as_bytes().to_vec()).collect();
        (args, cwd)
    }

    #[test]
    fn every_host_path_is_one_escaped_qemu_value() {
        let (args, _) = odd_args();
        let has = |want: &[u8]| args.iter().any(|a| a.as_slice() == want);
        assert!(has(
            b"local,path=/t/work,,path=/t/sibling 'q' \"d\" $x \\ * =\xff,mount_tag=cwd,\
              security_model=none,multidevs=remap"
        ));
        assert!(has(
            b"local,path=/c/runs/1,,2/a,mount_tag=out,security_model=none,multidevs=remap"
        ));
        assert!(has(
            b"local,path=/c/pk,,gs,mount_tag=pkgs,security_model=none,readonly=on,\
              multidevs=remap"
        ));
        assert!(has(
            b"dgram,id=wire,local.type=unix,local.path=/tmp,,x/testbed-1/a.sock,\
              remote.type=unix,remote.path=/tmp,,x/testbed-1/b.sock"
        ));
    }

    /// `--topology` places each NIC on its port with its speed; without it, no placement.
    #[test]
    fn topology_places_the_nics_and_adds_the_tree() {
        let accel = Accel {
            kvm: false,
            cpu: "max".into(),
            why: String::new(),
            brief: String::new(),
        };
        let boot = Boot {
            accel: &accel,
            vmlinuz: Path::new("/c/vmlinuz"),
            initrd: Path::new("/c/initrd"),
            sock_dir: Path::new("/tmp/s"),
            expose: Vec::new(),
            cwd: None,
            packages: None,
        };
        let args = |topology| {
            let opts = Opts {
                nodes: 2,
                nics: 4,
                topology,
                ..Opts::default()
            };
            let cmd = qemu(&boot, Path::new("/c/runs/1/a"), 'a', &opts);
            let v: Vec<String> = cmd
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            v.join(" ")
        };
        let with = args(true);
        assert!(
            with.contains("mac=52:54:00:00:00:01,bus=swp1,speed=25000,duplex=full"),
            "{with}"
        );
        assert!(
            with.contains("mac=52:54:00:00:03:01,bus=rp3,speed=10000"),
            "{with}"
        );
        assert!(with.contains("virtio-gpu-pci,bus=swp0"), "{with}");
        let without = args(false);
        assert!(
            !without.contains("bus=") && !without.contains("-numa"),
            "{without}"
        );
    }

    #[test]
    fn the_kernel_command_line_carries_no_host_path() {
        let (args, _) = odd_args();
        let at = args.iter().position(|a| a == b"-append").expect("-append");
        let cmdline = String::from_utf8(args[at + 1].clone()).expect("text");
        assert!(!cmdline.contains('/'), "{cmdline}");
        assert!(cmdline.contains("testbed.node=a"), "{cmdline}");
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
