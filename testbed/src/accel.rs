//! Which accelerator the testbed's VMs run on: KVM where a short probe boot shows that the
//! guest kernel boots under it, else TCG, QEMU's emulator.
//!
//! `/dev/kvm` existing is not enough: nested under another hypervisor, KVM may refuse the
//! guest's CPU model (QEMU cannot set an MSR the outer hypervisor does not pass on) or stop at
//! the first instruction its emulator cannot handle ("KVM internal error ... emulation
//! failure"). So before the first boot, the guest kernel is booted once under KVM with a
//! command that prints a marker and powers off; the answer is kept in the testbed's cache for
//! as long as the host stays up (the key holds the host's boot id, the QEMU and the kernel).
//! `TESTBED_ACCEL=tcg` or `kvm` skips the probe.

use crate::kernel::Kernel;
use crate::sh::{self, Result};
use crate::ui::Step;
use crate::{fail, programs, Cache};
use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Environment variable that picks the accelerator: `auto` (default: KVM if the probe boots),
/// `kvm` or `tcg`.
pub const ACCEL_ENV: &str = "TESTBED_ACCEL";

/// The CPU model under TCG (docs/testbed.md, "Emulator speed"). `TESTBED_CPU` overrides it.
pub const TCG_CPU: &str = "max";

/// Environment variable naming another CPU model for TCG.
pub const CPU_ENV: &str = "TESTBED_CPU";

/// Kernel command-line words the guests get under TCG: the emulated CPU needs no protection
/// from speculative-execution attacks, and the mitigations cost emulated time.
pub const TCG_KERNEL_ARGS: &str = "mitigations=off";

/// The CPU models tried under KVM, in order: the host's own, then the same without the
/// architectural-capabilities MSR that nested KVM often lacks.
pub const KVM_CPUS: &[&str] = &["host", "host,-arch-capabilities"];

/// How long one probe boot may take: a working KVM boots the guest kernel in a second or two.
const PROBE_LIMIT: Duration = Duration::from_secs(20);

/// What the probe's guest prints once the kernel runs its first program.
const PROBE_MARK: &str = "testbed-kvm-probe-ok";

/// The accelerator of a run, and why it was picked.
#[derive(Clone, Debug)]
pub struct Accel {
    /// KVM (else TCG).
    pub kvm: bool,
    /// The `-cpu` model.
    pub cpu: String,
    /// Why this accelerator and not the other, in full (QEMU's own words where the probe
    /// failed): `dmabuf-testbed info` and `--verbose` print it.
    pub why: String,
    /// The same in a few words, for the run's header ([`Accel::summary`]).
    pub brief: String,
}

/// The short reason of a TCG run whose `/dev/kvm` is there but does not work for the guest.
pub const KVM_UNUSABLE: &str = "KVM unusable here: see `dmabuf-testbed info`";

impl Accel {
    /// TCG, with the reason KVM is not used, in full and in a few words.
    fn tcg(why: impl Into<String>, brief: impl Into<String>) -> Accel {
        Accel {
            kvm: false,
            cpu: std::env::var(CPU_ENV).unwrap_or_else(|_| TCG_CPU.into()),
            why: why.into(),
            brief: brief.into(),
        }
    }

    /// `-accel ... -cpu ...` for QEMU.
    pub fn qemu_args(&self) -> [&str; 4] {
        let accel = if self.kvm { "kvm" } else { "tcg" };
        ["-accel", accel, "-cpu", &self.cpu]
    }

    /// Extra kernel command-line words.
    pub fn kernel_args(&self) -> &'static str {
        if self.kvm {
            ""
        } else {
            TCG_KERNEL_ARGS
        }
    }

    /// One short line for the run's header: `KVM (-cpu host)`, or `TCG (<why, briefly>)`,
    /// e.g. `TCG (KVM unusable here: see `dmabuf-testbed info`)`.
    pub fn summary(&self) -> String {
        if self.kvm {
            format!("KVM (-cpu {})", self.cpu)
        } else {
            format!("TCG ({})", self.brief)
        }
    }

    /// `KVM (-cpu host)` or `TCG (-cpu max)`, with the whole reason (for `--verbose` and
    /// `dmabuf-testbed info`).
    pub fn describe(&self) -> String {
        format!(
            "{} (-cpu {}): {}",
            if self.kvm { "KVM" } else { "TCG" },
            self.cpu,
            self.why
        )
    }
}

/// Picks the accelerator for booting `kernel` with `initrd` (probing KVM once per host boot,
/// see the module's docs).
///
/// # Errors
/// `TESTBED_ACCEL` has an unknown value, or `kvm` was asked for and does not boot the guest.
pub fn choose(cache: &Cache, kernel: &Kernel, initrd: &Path) -> Result<Accel> {
    let asked = std::env::var(ACCEL_ENV).unwrap_or_default();
    match asked.as_str() {
        "tcg" => {
            let why = format!("{ACCEL_ENV}=tcg");
            return Ok(Accel::tcg(why.clone(), why));
        }
        "" | "auto" | "kvm" => {}
        other => fail!("{ACCEL_ENV}={other}: auto, kvm or tcg"),
    }
    if let Err((why, brief)) = kvm_device() {
        if asked == "kvm" {
            fail!("{ACCEL_ENV}=kvm, but {why}");
        }
        return Ok(Accel::tcg(why, brief));
    }
    let mut failures = Vec::new();
    for cpu in KVM_CPUS {
        match cached_probe(cache, kernel, initrd, cpu)? {
            Ok(()) => {
                return Ok(Accel {
                    kvm: true,
                    cpu: cpu.to_string(),
                    why: "a probe boot of the guest kernel worked".into(),
                    brief: "a probe boot worked".into(),
                })
            }
            Err(why) => failures.push(format!("-cpu {cpu}: {why}")),
        }
    }
    let why = format!(
        "/dev/kvm is there, but the guest kernel does not boot under it ({})",
        failures.join("; ")
    );
    if asked == "kvm" {
        fail!("{ACCEL_ENV}=kvm, but {why}");
    }
    Ok(Accel::tcg(why, KVM_UNUSABLE))
}

/// The version of the QEMU the testbed runs (`10.0.2`), with a warning when it is older than
/// the one setup installs; asked once per process.
pub fn qemu_version() -> String {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION
        .get_or_init(|| {
            let out = sh::output(programs::cmd("qemu-system-x86_64").arg("--version"))
                .unwrap_or_default();
            let v = out
                .split_whitespace()
                .skip_while(|w| *w != "version")
                .nth(1)
                .unwrap_or("(unknown version)")
                .to_string();
            let major: u32 = v
                .split('.')
                .next()
                .and_then(|m| m.parse().ok())
                .unwrap_or(0);
            if major < 10 {
                format!("{v} (older than 10: expect the TCG fault of docs/testbed.md)")
            } else {
                v
            }
        })
        .clone()
}

/// Whether `/dev/kvm` exists and opens for reading and writing; if not, why (in full and
/// briefly).
fn kvm_device() -> std::result::Result<(), (String, String)> {
    let dev = Path::new("/dev/kvm");
    if !dev.exists() {
        return Err(("no /dev/kvm on this host".into(), "no /dev/kvm".into()));
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)
        .map(drop)
        .map_err(|e| (format!("/dev/kvm does not open: {e}"), KVM_UNUSABLE.into()))
}

/// The probe's verdict for `cpu`, from the cache when this host boot already has one.
fn cached_probe(
    cache: &Cache,
    kernel: &Kernel,
    initrd: &Path,
    cpu: &str,
) -> Result<std::result::Result<(), String>> {
    let dir = cache.dir.join("kvm-probe");
    std::fs::create_dir_all(&dir)?;
    let file = dir.join(format!("{:016x}", probe_key(kernel, initrd, cpu)));
    if let Ok(text) = std::fs::read_to_string(&file) {
        return Ok(match text.strip_prefix("no: ") {
            Some(why) => Err(format!("{} (probed earlier in this host boot)", why.trim())),
            None => Ok(()),
        });
    }
    let step = Step::check(format!("probing KVM with -cpu {cpu} (one short boot)"));
    let verdict = probe(kernel, initrd, cpu)?;
    step.done_with(match &verdict {
        Ok(()) => "works",
        Err(_) => "does not work",
    });
    let text = match &verdict {
        Ok(()) => "ok\n".to_string(),
        Err(why) => format!("no: {why}\n"),
    };
    sh::write(&file, &text)?;
    Ok(verdict)
}

/// What a probe's answer depends on: the host's boot, the QEMU binary, the guest kernel and
/// initramfs, the CPU model.
fn probe_key(kernel: &Kernel, initrd: &Path, cpu: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default()
        .hash(&mut h);
    let qemu = programs::cmd("qemu-system-x86_64");
    qemu.get_program().hash(&mut h);
    let modified = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    which(qemu.get_program())
        .and_then(|p| modified(&p))
        .hash(&mut h);
    kernel.version.hash(&mut h);
    initrd.hash(&mut h);
    cpu.hash(&mut h);
    h.finish()
}

/// The file a program name resolves to on `PATH` (itself when it has a slash).
fn which(program: &std::ffi::OsStr) -> Option<std::path::PathBuf> {
    let p = Path::new(program);
    if p.components().count() > 1 {
        return Some(p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
}

/// Boots `kernel` under KVM with `-cpu cpu` and a command that prints [`PROBE_MARK`]; Ok once
/// the mark appears, else why not (QEMU's own words), within [`PROBE_LIMIT`].
fn probe(kernel: &Kernel, initrd: &Path, cpu: &str) -> Result<std::result::Result<(), String>> {
    let mut child = programs::cmd("qemu-system-x86_64")
        .args(["-machine", "q35", "-accel", "kvm", "-cpu", cpu])
        .args(["-smp", "1", "-m", "512", "-nic", "none"])
        .args(["-display", "none", "-serial", "stdio", "-monitor", "none"])
        .arg("-no-reboot")
        .arg("-kernel")
        .arg(kernel.vmlinuz())
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 loglevel=1 panic=-1 rdinit={} -- sh -c \"echo {PROBE_MARK}; {} \
             poweroff -f\"",
            programs::BUSYBOX,
            programs::BUSYBOX
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start qemu-system-x86_64: {e}"))?;
    let out = Arc::new(Mutex::new(String::new()));
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|mut s| {
        let out = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut o) = out.lock() {
                    o.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        })
    })
    .collect();
    let start = Instant::now();
    let seen = |out: &Arc<Mutex<String>>| out.lock().map(|o| o.clone()).unwrap_or_default();
    let verdict = loop {
        let text = seen(&out);
        if text.contains(PROBE_MARK) {
            break Ok(());
        }
        if text.contains("KVM internal error") {
            break Err(format!("KVM stopped the guest: {}", first_error(&text)));
        }
        if child.try_wait()?.is_some() {
            // Let the readers drain what it printed last.
            std::thread::sleep(Duration::from_millis(100));
            let text = seen(&out);
            if text.contains(PROBE_MARK) {
                break Ok(());
            }
            break Err(format!("QEMU exited: {}", first_error(&text)));
        }
        if start.elapsed() > PROBE_LIMIT {
            break Err(format!("the guest did not boot within {PROBE_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    for r in readers {
        let _ = r.join();
    }
    Ok(verdict)
}

/// QEMU's first error line in `text` (or its last line), for the run's header.
fn first_error(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines
        .iter()
        .find(|l| l.contains("error") || l.contains("KVM internal"))
        .or(lines.last())
        .map(|l| l.trim_start_matches("qemu-system-x86_64: ").to_string())
        .unwrap_or_else(|| "no output".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_errors_are_quoted_briefly() {
        let text = "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69\n\
                    qemu-system-x86_64: ../kvm.c:3183: kvm_buf_set_msrs: Assertion failed.\n";
        assert_eq!(first_error(text), "error: failed to set MSR 0x10a to 0x69");
        assert_eq!(
            first_error("KVM internal error. Suberror: 1\nextra data[0]: 0x1\n"),
            "KVM internal error. Suberror: 1"
        );
        assert_eq!(first_error(""), "no output");
    }

    #[test]
    fn tcg_says_why_and_adds_its_kernel_words() {
        let a = Accel::tcg("no /dev/kvm on this host", "no /dev/kvm");
        assert_eq!(a.qemu_args(), ["-accel", "tcg", "-cpu", a.cpu.as_str()]);
        assert_eq!(a.kernel_args(), TCG_KERNEL_ARGS);
        assert!(a.describe().starts_with("TCG (-cpu "));
        assert!(a.describe().ends_with("no /dev/kvm on this host"));
        assert_eq!(a.summary(), "TCG (no /dev/kvm)");
    }

    /// The probe's failure as a user would see it: one long line of QEMU's words.
    const PROBE_FAILURE: &str = "/dev/kvm is there, but the guest kernel does not boot under \
        it (-cpu host: KVM stopped the guest: KVM internal error. Suberror: 1 (probed earlier \
        in this host boot); -cpu host,-arch-capabilities: QEMU exited: error: failed to set \
        MSR 0x10a to 0x69 (probed earlier in this host boot))";

    #[test]
    fn the_header_line_is_short_and_the_details_stay_in_describe() {
        let a = Accel::tcg(PROBE_FAILURE, KVM_UNUSABLE);
        let line = format!("QEMU 10.0.2, {}", a.summary());
        assert_eq!(
            line,
            "QEMU 10.0.2, TCG (KVM unusable here: see `dmabuf-testbed info`)"
        );
        assert!(line.len() <= 80, "{line}");
        for detail in ["MSR", "Suberror", "probed", "-cpu"] {
            assert!(!line.contains(detail), "{line}");
        }
        // The details are kept for --verbose and `dmabuf-testbed info`.
        assert!(a.describe().contains("failed to set MSR 0x10a"));
        assert!(a.describe().contains("KVM internal error. Suberror: 1"));
        let kvm = Accel {
            kvm: true,
            cpu: "host".into(),
            why: "a probe boot of the guest kernel worked".into(),
            brief: "a probe boot worked".into(),
        };
        assert_eq!(kvm.summary(), "KVM (-cpu host)");
    }
}
