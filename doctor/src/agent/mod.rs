//! Health of a transfer-engine agent (`gpu-rdma-doctor agent`): given the settings an agent
//! would start with, whether each thing it needs is there, and what to fix when not.
//!
//! * `control`: the control port is free to bind at [`AgentOptions::bind`], and a
//!   connection to the address peers would use reaches a listener the doctor holds there
//!   (the engine's card rule: the bound address, or for `0.0.0.0` the IPv4 address of the
//!   first RoCE v2 GID of the agent's devices);
//! * `etcd` (with [`AgentOptions::etcd`]): each endpoint answers within a bound, and a probe
//!   key under the prefix, on a short lease, is written, read back and deleted (the cargo
//!   feature `etcd`);
//! * `devices`: each device named (or every device) exists, and its port 1 is `ACTIVE`;
//! * `nics`: the tier-0 NICs of each GPU among the agent's devices, after the override.
//!
//! ```no_run
//! let options = gpu_rdma_doctor::AgentOptions {
//!     bind: "10.0.0.2:7000".parse().unwrap(),
//!     etcd: vec!["http://10.0.0.1:2379".into()],
//!     ..Default::default()
//! };
//! let report = gpu_rdma_doctor::agent::run(&options);
//! eprint!("{}", report.render());
//! assert!(report.ready(), "{}", report.verdict.line);
//! ```

pub mod args;
mod control;
mod devices;
mod etcd;

use crate::{Check, Status, Verdict};
use gpu_rdma_topology::NicOverride;
use serde::Serialize;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The settings of the agent to check, with the engine's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentOptions {
    /// The RDMA devices the agent is given (`Settings::devices`); `None`: every device whose
    /// port 1 is active, as the engine picks them.
    pub devices: Option<Vec<String>>,
    /// Where its control listener binds (`Settings::bind`; default `0.0.0.0:0`).
    pub bind: SocketAddr,
    /// etcd's client URLs (`EtcdSettings::endpoints`); empty: no etcd to check.
    pub etcd: Vec<String>,
    /// The prefix of the agent's etcd keys (`EtcdSettings::prefix`; default `/gpu-rdma`).
    pub etcd_prefix: String,
    /// Bounds each connection and request to etcd (default 5 s).
    pub etcd_timeout: Duration,
    /// The NIC override (`Settings::nics`); `None`: `GPU_RDMA_NICS`, as the engine reads it.
    pub nics: Option<NicOverride>,
    /// The sysfs root (`/sys`).
    pub sysfs: PathBuf,
}

/// The engine's default bind address (`Settings::default().bind`): any address, a port the
/// kernel picks.
pub const DEFAULT_BIND: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

/// The engine's default etcd key prefix (`EtcdSettings::default().prefix`).
pub const DEFAULT_ETCD_PREFIX: &str = "/gpu-rdma";

impl Default for AgentOptions {
    fn default() -> AgentOptions {
        AgentOptions {
            devices: None,
            bind: DEFAULT_BIND,
            etcd: Vec::new(),
            etcd_prefix: DEFAULT_ETCD_PREFIX.into(),
            // The engine's default is 2 s; an answer between the two is reported with its
            // time, and a guest under emulation answers slowly.
            etcd_timeout: Duration::from_secs(5),
            nics: None,
            sysfs: PathBuf::from("/sys"),
        }
    }
}

/// The settings as the report shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SettingsShown {
    /// The devices named, or `None` for every active one.
    pub devices: Option<Vec<String>>,
    /// The bind address.
    pub bind: String,
    /// etcd's endpoints (empty: not used).
    pub etcd: Vec<String>,
    /// The etcd key prefix.
    pub etcd_prefix: String,
    /// The NIC override given (`--nics`), in its own syntax.
    pub nics: Option<String>,
}

/// What [`run`] found.
#[derive(Clone, Debug, Serialize)]
pub struct AgentReport {
    /// The settings checked.
    pub settings: SettingsShown,
    /// The findings, by section: `control`, `etcd`, `devices`, `nics`.
    pub checks: Vec<Check>,
    /// The summary.
    pub verdict: Verdict,
}

impl AgentReport {
    /// Whether no check failed (the program's exit status is 0 exactly then).
    pub fn ready(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// The report as text: one line per check with its fix, then the verdict.
    pub fn render(&self) -> String {
        let s = &self.settings;
        let mut out = format!(
            "gpu-rdma-doctor agent: can an agent start here with devices {}, bind {}{}?\n",
            s.devices
                .as_ref()
                .map_or("(every active one)".to_string(), |d| d.join(",")),
            s.bind,
            if s.etcd.is_empty() {
                String::new()
            } else {
                format!(", etcd {} under {}", s.etcd.join(","), s.etcd_prefix)
            }
        );
        out.push_str(&crate::render::check_lines(&self.checks));
        let _ = writeln!(
            out,
            "\nverdict [{}] {}",
            self.verdict.status.label(),
            self.verdict.line
        );
        out
    }

    /// The report as one JSON document.
    pub fn to_json(&self) -> String {
        crate::json(self)
    }

    /// The checks of `section`.
    pub fn section<'a>(&'a self, section: &'a str) -> impl Iterator<Item = &'a Check> {
        crate::in_section(&self.checks, section)
    }
}

/// Runs every check of an agent with `options`. Every wait is bounded: a connection to the
/// control address by 2 s, each etcd request by [`AgentOptions::etcd_timeout`].
pub fn run(options: &AgentOptions) -> AgentReport {
    let found = devices::inspect(&options.sysfs, options.devices.as_deref());
    let mut checks = control::checks(options.bind, &found.card_ips, !options.etcd.is_empty());
    if !options.etcd.is_empty() {
        checks.extend(etcd::checks(
            &options.etcd,
            &options.etcd_prefix,
            options.etcd_timeout,
        ));
    }
    checks.extend(found.checks.iter().cloned());
    checks.extend(devices::nic_checks(
        &options.sysfs,
        &found.used,
        options.nics.as_ref(),
    ));
    AgentReport {
        settings: SettingsShown {
            devices: options.devices.clone(),
            bind: options.bind.to_string(),
            etcd: options.etcd.clone(),
            etcd_prefix: options.etcd_prefix.clone(),
            nics: options.nics.as_ref().map(ToString::to_string),
        },
        verdict: verdict(&checks),
        checks,
    }
}

/// Ok when every check is ok, warn when some warned, fail naming the first failure (the one
/// to fix first) and its fix.
pub fn verdict(checks: &[Check]) -> Verdict {
    let warned = checks.iter().filter(|c| c.status == Status::Warn).count();
    if let Some(c) = checks.iter().find(|c| c.status == Status::Fail) {
        let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
        return Verdict {
            status: Status::Fail,
            line: format!(
                "an agent with these settings would not work ({failed} failed): {}",
                c.summary()
            ),
        };
    }
    Verdict {
        status: if warned == 0 {
            Status::Ok
        } else {
            Status::Warn
        },
        line: match warned {
            0 => "an agent can start with these settings".into(),
            n => format!("an agent can start with these settings; {n} warned checks above"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(checks: Vec<Check>) -> AgentReport {
        AgentReport {
            settings: SettingsShown {
                devices: Some(vec!["rxe0".into()]),
                bind: "10.0.0.2:7000".into(),
                etcd: vec!["http://10.0.0.1:2379".into()],
                etcd_prefix: "/gpu-rdma".into(),
                nics: None,
            },
            verdict: verdict(&checks),
            checks,
        }
    }

    #[test]
    fn the_verdict_names_the_first_failure_and_its_fix() {
        let ok = Check::ok("control", "control port 10.0.0.2:7000", "free");
        let mut failed = Check::ok("etcd", "etcd http://10.0.0.1:2379", "refused");
        failed.status = Status::Fail;
        failed.fix = Some("start etcd".into());
        let r = report(vec![ok.clone(), failed]);
        assert!(!r.ready());
        assert_eq!(r.verdict.status, Status::Fail);
        assert!(
            r.verdict
                .line
                .contains("etcd http://10.0.0.1:2379: refused -> fix: start etcd"),
            "{}",
            r.verdict.line
        );
        let r = report(vec![ok]);
        assert!(r.ready());
        assert_eq!(r.verdict.status, Status::Ok);
    }

    #[test]
    fn text_and_json_carry_every_check_with_its_fix() {
        let mut taken = Check::ok("control", "control port 10.0.0.2:7000", "EADDRINUSE");
        taken.status = Status::Fail;
        taken.fix = Some("pick another port".into());
        let r = report(vec![taken]);
        let text = r.render();
        assert!(text.contains("bind 10.0.0.2:7000, etcd http://10.0.0.1:2379 under /gpu-rdma"));
        assert!(text.contains("\ncontrol\n  [fail] control port 10.0.0.2:7000: EADDRINUSE\n"));
        assert!(text.contains("         fix: pick another port\n"), "{text}");
        assert!(text.contains("\nverdict [fail] "), "{text}");
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["settings"]["bind"], "10.0.0.2:7000");
        assert_eq!(v["checks"][0]["section"], "control");
        assert_eq!(v["checks"][0]["status"], "fail");
        assert_eq!(v["checks"][0]["fix"], "pick another port");
        assert_eq!(v["verdict"]["status"], "fail");
    }
}
