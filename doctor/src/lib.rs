//! A doctor for GPU-memory RDMA: checks, one by one, what `ibv_reg_dmabuf_mr` of a GPU buffer
//! needs on this machine (kernel, modules, rdma-core, each RDMA device and its provider, each
//! DRM device and its permissions, NVIDIA's modules, the PCIe path between each GPU and NIC
//! and the NIC the transfer engine would choose for each GPU ([`topology::nic_choices`]),
//! IOMMU, BARs, limits), then proves it end to end: it allocates a small buffer from each
//! source and placement, exports it as a dma-buf and registers it on each RDMA device.
//!
//! Every [`Check`] says ok, warn or fail, what was found, and the fix; the fixes come from one
//! table, [`problems::PROBLEMS`], which also generates the "Common errors" table of
//! `docs/hardware.md`. A program can run it at start-up and log it:
//!
//! ```no_run
//! let report = gpu_rdma_doctor::run(&gpu_rdma_doctor::Options::default());
//! eprint!("{}", report.render());
//! if !report.dmabuf_works() {
//!     eprintln!("GPU-memory RDMA will not work here: {}", report.verdict.line);
//! }
//! ```
//!
//! The command-line program `gpu-rdma-doctor` prints the same (`--json`: one JSON document)
//! and exits 0 only when a dma-buf registration worked.
//!
//! [`agent::run`] (`gpu-rdma-doctor agent`) checks what a transfer-engine agent with given
//! settings needs: its control port, etcd, its devices and the NIC of each GPU.

pub mod agent;
pub mod drm;
/// PCI details read from sysfs (BARs, ACS): [`gpu_rdma_topology::pci`].
pub use gpu_rdma_topology::pci;
pub mod probe;
pub mod problems;
pub mod rdma;
mod render;
pub mod system;
pub mod topology;

pub use agent::{AgentOptions, AgentReport};
use serde::Serialize;
use std::path::PathBuf;

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine (or nothing to check).
    Ok,
    /// Works, but something limits it or may stop it elsewhere.
    Warn,
    /// Stops GPU-memory RDMA.
    Fail,
}

impl Status {
    /// `ok`, `warn` or `fail`.
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// The part of the machine it is about (`kernel`, `rdma`, `drm`, `topology`, ...).
    pub section: &'static str,
    /// What was checked, e.g. `rxe0 dma-buf MRs`.
    pub name: String,
    /// How it came out.
    pub status: Status,
    /// What was found.
    pub found: String,
    /// What to do, when not ok (from [`problems::PROBLEMS`], sometimes with specifics).
    pub fix: Option<String>,
    /// The [`problems::Problem`] this finding is, if any.
    pub problem: Option<&'static str>,
}

impl Check {
    /// `name: found`, then ` -> fix: fix` when it has one: the check in one line.
    pub(crate) fn summary(&self) -> String {
        let fix = self.fix.as_ref().map(|f| format!(" -> fix: {f}"));
        format!("{}: {}{}", self.name, self.found, fix.unwrap_or_default())
    }

    /// An ok finding.
    pub fn ok(section: &'static str, name: impl Into<String>, found: impl Into<String>) -> Check {
        Check {
            section,
            name: name.into(),
            status: Status::Ok,
            found: found.into(),
            fix: None,
            problem: None,
        }
    }

    /// A warn or fail finding that is the known problem `p`: its fix is the table's.
    pub fn problem(
        section: &'static str,
        name: impl Into<String>,
        status: Status,
        found: impl Into<String>,
        p: &'static problems::Problem,
    ) -> Check {
        Check {
            section,
            name: name.into(),
            status,
            found: found.into(),
            fix: Some(p.fix.to_string()),
            problem: Some(p.id),
        }
    }

    /// Appends specifics (a group's name, a device) to the fix.
    pub fn with_detail(mut self, detail: impl AsRef<str>) -> Check {
        let detail = detail.as_ref();
        self.fix = Some(match self.fix {
            Some(f) => format!("{detail}; {f}"),
            None => detail.to_string(),
        });
        self
    }
}

/// One cell of the end-to-end matrix: a buffer from `source` in `placement`, exported as a
/// dma-buf and registered on `nic`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Registration {
    /// Where the buffer came from: a DRM driver (`vgem`, `i915`, `amdgpu`), `udmabuf`,
    /// `dma-heap system`, `cuda`.
    pub source: String,
    /// The node or device it was allocated on (`/dev/dri/card0`, `/dev/udmabuf`, ...).
    pub node: String,
    /// `system`, `device`, `dumb` (no placement), `host` (udmabuf, heaps).
    pub placement: String,
    /// The RDMA device.
    pub nic: String,
    /// Whether `ibv_reg_dmabuf_mr` of the whole buffer succeeded.
    pub registered: bool,
    /// The exporter's name and size, or the error.
    pub detail: String,
}

/// The summary line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Ok when a dma-buf registration worked and nothing failed, warn when one worked
    /// despite failures elsewhere, fail when none worked.
    pub status: Status,
    /// One line.
    pub line: String,
}

/// Everything the doctor found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The findings, in the order they were made.
    pub checks: Vec<Check>,
    /// The end-to-end registration matrix (buffer source x placement x NIC).
    pub matrix: Vec<Registration>,
    /// The summary.
    pub verdict: Verdict,
}

impl Report {
    /// Whether a dma-buf registration worked on at least one buffer x NIC pair (the
    /// program's exit status is 0 exactly then).
    pub fn dmabuf_works(&self) -> bool {
        self.matrix.iter().any(|r| r.registered)
    }

    /// The report as text: one line per check (`[ok]`, `[warn]`, `[fail]`) with its fix, the
    /// matrix, and the verdict.
    pub fn render(&self) -> String {
        render::text(self)
    }

    /// The report as one JSON document.
    pub fn to_json(&self) -> String {
        json(self)
    }

    /// The checks of `section`.
    pub fn section<'a>(&'a self, section: &'a str) -> impl Iterator<Item = &'a Check> {
        in_section(&self.checks, section)
    }
}

/// What to check and where.
#[derive(Clone, Debug)]
pub struct Options {
    /// The sysfs root (`/sys`); tests point it at a recorded tree.
    pub sysfs: PathBuf,
    /// Bytes per probe buffer (a multiple of the page size).
    pub probe_size: u64,
    /// Skip the end-to-end probe (allocation and registration).
    pub no_probe: bool,
}

/// A report as one JSON document (an error's text as one, should it not serialise).
pub(crate) fn json(report: &impl Serialize) -> String {
    serde_json::to_string_pretty(report).unwrap_or_else(|e| {
        format!(
            "{{\"error\": {:?}}}",
            format!("serialising the report: {e}")
        )
    })
}

/// The checks of `section` among `checks`.
pub(crate) fn in_section<'a>(
    checks: &'a [Check],
    section: &'a str,
) -> impl Iterator<Item = &'a Check> {
    checks.iter().filter(move |c| c.section == section)
}

impl Default for Options {
    fn default() -> Options {
        Options {
            sysfs: PathBuf::from("/sys"),
            probe_size: 64 * 1024,
            no_probe: false,
        }
    }
}

/// Runs every check and the end-to-end probe.
pub fn run(options: &Options) -> Report {
    let mut checks = Vec::new();
    checks.extend(system::kernel_checks());
    // Listing the RDMA devices loads their providers, which the rdma-core check reports.
    let nics = rdma::inspect(&options.sysfs);
    checks.extend(system::rdma_core_checks());
    checks.extend(nics.checks.iter().cloned());
    let gpus = drm::inspect(&options.sysfs);
    checks.extend(gpus.checks.iter().cloned());
    checks.extend(system::nvidia_checks());
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    checks.extend(topology::checks(&options.sysfs, &cmdline));
    checks.extend(system::memory_checks());
    let matrix = if options.no_probe {
        Vec::new()
    } else {
        probe::matrix(&gpus, &nics, options.probe_size)
    };
    checks.push(probe::summary(&matrix, options.no_probe, &nics));
    let verdict = verdict(&checks, &matrix);
    Report {
        checks,
        matrix,
        verdict,
    }
}

/// The one-line verdict: ok when a dma-buf registration worked (warn if something failed
/// too); fail otherwise, naming the first failure, which is the one to fix first.
pub fn verdict(checks: &[Check], matrix: &[Registration]) -> Verdict {
    let worked: Vec<&Registration> = matrix.iter().filter(|r| r.registered).collect();
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    let warned = checks.iter().filter(|c| c.status == Status::Warn).count();
    if let Some(first) = worked.first() {
        let line = format!(
            "GPU-memory RDMA works: {} of {} dma-buf registrations succeeded (e.g. {} {} on {}){}",
            worked.len(),
            matrix.len(),
            first.source,
            first.placement,
            first.nic,
            match (failed, warned) {
                (0, 0) => String::new(),
                (f, w) => format!("; {f} failed and {w} warned checks above"),
            }
        );
        let status = if failed == 0 {
            Status::Ok
        } else {
            Status::Warn
        };
        return Verdict { status, line };
    }
    let line = match checks.iter().find(|c| c.status == Status::Fail) {
        Some(c) => format!("GPU-memory RDMA does not work: {}", c.summary()),
        None => "GPU-memory RDMA does not work: no dma-buf registration succeeded".to_string(),
    };
    Verdict {
        status: Status::Fail,
        line,
    }
}

// The README's examples are compiled as doc tests, so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
