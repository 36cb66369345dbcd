//! The command line of `gpu-rdma-doctor agent`.

use super::AgentOptions;
use gpu_rdma_topology::NicOverride;
use std::fmt;
use std::time::Duration;

/// The usage text of `gpu-rdma-doctor agent`.
pub const USAGE: &str = "usage: gpu-rdma-doctor agent [--devices DEV[,DEV...]] [--bind IP:PORT] \
[--etcd URL[,URL...]] [--etcd-prefix PREFIX] [--etcd-timeout SECS] [--nics RULES] [--json]

Checks what a transfer-engine agent with these settings needs, and says what to fix.

  --devices DEV,...  the RDMA devices the agent is given (default: every device whose port 1
                     is ACTIVE, as the engine picks them)
  --bind IP:PORT     where its control listener binds (default 0.0.0.0:0)
  --etcd URL,...     etcd's client URLs (http://IP:PORT); checks that each answers and that a
                     key under the prefix can be written (default: no etcd)
  --etcd-prefix P    the prefix of the agent's keys in etcd (default /gpu-rdma)
  --etcd-timeout S   bounds each connection and request to etcd, in seconds (default 5)
  --nics RULES       the NIC override, as GPU_RDMA_NICS (default: GPU_RDMA_NICS)
  --json             print the report as one JSON document

Exit status: 0 when every check is ok or warn, 1 when one fails, 2 on a usage error.";

/// A command line that is not one of `gpu-rdma-doctor agent`: why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Check an agent with these options; `json`: print JSON.
    Check {
        /// The agent's settings.
        options: AgentOptions,
        /// Print the report as JSON rather than text.
        json: bool,
    },
    /// Print [`USAGE`].
    Help,
}

/// A comma-separated list with no empty item.
fn list(flag: &str, value: &str) -> Result<Vec<String>, UsageError> {
    let items: Vec<String> = value.split(',').map(|s| s.trim().to_string()).collect();
    if items.iter().any(String::is_empty) {
        return Err(UsageError(format!(
            "{flag} takes a comma-separated list with no empty item, not {value:?}"
        )));
    }
    Ok(items)
}

/// Parses the arguments after `agent` (`--flag VALUE` or `--flag=VALUE`).
///
/// # Errors
/// [`UsageError`] for an unknown argument, a flag without its value, or a value that does
/// not parse (an address, a NIC override), each saying which and why.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, UsageError> {
    let mut options = AgentOptions::default();
    let mut json = false;
    let mut etcd_flag_given = false;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg, None),
        };
        let takes_value = matches!(
            flag.as_str(),
            "--devices" | "--bind" | "--etcd" | "--etcd-prefix" | "--etcd-timeout" | "--nics"
        );
        let value = if takes_value {
            match inline.or_else(|| args.next()) {
                Some(v) => v,
                None => return Err(UsageError(format!("{flag} takes a value"))),
            }
        } else if inline.is_some() {
            return Err(UsageError(format!("{flag} takes no value")));
        } else {
            String::new()
        };
        match flag.as_str() {
            "--devices" => options.devices = Some(list(&flag, &value)?),
            "--bind" => {
                options.bind = value.trim().parse().map_err(|_| {
                    UsageError(format!(
                        "--bind takes IP:PORT (0.0.0.0:7000, [::]:7000), not {value:?}"
                    ))
                })?;
            }
            "--etcd" => {
                options.etcd = list(&flag, &value)?
                    .into_iter()
                    .map(|u| {
                        if u.contains("://") {
                            u
                        } else {
                            format!("http://{u}")
                        }
                    })
                    .collect();
            }
            "--etcd-prefix" => {
                if value.is_empty() {
                    return Err(UsageError("--etcd-prefix takes a non-empty prefix".into()));
                }
                etcd_flag_given = true;
                options.etcd_prefix = value;
            }
            "--etcd-timeout" => {
                options.etcd_timeout = value
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|s| (0.001..=3600.0).contains(s))
                    .map(Duration::from_secs_f64)
                    .ok_or_else(|| {
                        UsageError(format!(
                            "--etcd-timeout takes seconds, at least 0.001 and at most 3600, \
                             not {value:?}"
                        ))
                    })?;
                etcd_flag_given = true;
            }
            "--nics" => {
                options.nics = Some(
                    value
                        .parse::<NicOverride>()
                        .map_err(|e| UsageError(format!("--nics: {e}")))?,
                );
            }
            "--json" => json = true,
            "-h" | "--help" => return Ok(Command::Help),
            other => return Err(UsageError(format!("unknown argument {other:?}"))),
        }
    }
    if etcd_flag_given && options.etcd.is_empty() {
        return Err(UsageError(
            "--etcd-prefix and --etcd-timeout need --etcd (the endpoints to check)".into(),
        ));
    }
    Ok(Command::Check { options, json })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn no_arguments_are_the_engines_defaults() {
        assert_eq!(
            parsed(&[]),
            Ok(Command::Check {
                options: AgentOptions::default(),
                json: false
            })
        );
        let d = AgentOptions::default();
        assert_eq!(d.bind.to_string(), "0.0.0.0:0");
        assert_eq!(d.etcd_prefix, "/gpu-rdma");
        assert!(d.etcd.is_empty() && d.devices.is_none() && d.nics.is_none());
    }

    #[test]
    fn every_flag_in_both_spellings() {
        let Ok(Command::Check { options, json }) = parsed(&[
            "--devices",
            "rxe0,rxe1",
            "--bind=10.0.0.2:7000",
            "--etcd",
            "10.0.0.1:2379,https://etcd:2379",
            "--etcd-prefix=/cluster-a",
            "--etcd-timeout",
            "0.5",
            "--nics",
            "*=rxe1",
            "--json",
        ]) else {
            panic!("did not parse")
        };
        assert!(json);
        assert_eq!(options.devices, Some(vec!["rxe0".into(), "rxe1".into()]));
        assert_eq!(options.bind.to_string(), "10.0.0.2:7000");
        assert_eq!(
            options.etcd,
            vec![
                "http://10.0.0.1:2379".to_string(),
                "https://etcd:2379".into()
            ]
        );
        assert_eq!(options.etcd_prefix, "/cluster-a");
        assert_eq!(options.etcd_timeout, Duration::from_millis(500));
        assert_eq!(options.nics, Some("*=rxe1".parse().unwrap()));
        assert_eq!(parsed(&["-h"]), Ok(Command::Help));
    }

    #[test]
    fn usage_errors_say_which_argument_and_why() {
        let why = |args: &[&str]| parsed(args).unwrap_err().0;
        assert!(why(&["--bind", "7000"]).contains("--bind takes IP:PORT"));
        assert!(why(&["--bind"]).contains("--bind takes a value"));
        assert!(why(&["--devices", "rxe0,,rxe1"]).contains("no empty item"));
        assert!(why(&["--nics", "gpu0=rxe0"]).starts_with("--nics: \"gpu0\""));
        assert!(why(&["--etcd-prefix", "/p"]).contains("need --etcd"));
        assert!(why(&["--json=yes"]).contains("takes no value"));
        assert!(why(&["--etcd=x", "--etcd-timeout", "0"]).contains("at least 0.001"));
        assert!(why(&["--etcd=x", "--etcd-timeout", "1e-12"]).contains("at least 0.001"));
        assert!(why(&["--etcd=x", "--etcd-timeout", "inf"]).contains("at most 3600"));
        assert!(why(&["--frobnicate"]).contains("unknown argument \"--frobnicate\""));
    }
}
