//! The NIC override: per place of memory, the NICs to use first, for machines whose firmware
//! misreports the topology or whose operators know better.
//!
//! Syntax (the environment variable [`NICS_ENV`], or the text parsed with `str::parse`):
//! rules separated by `;`, each `<place>=<nic>[,<nic>...]`, where a place is a PCI address
//! (`0000:22:00.0`; `22:00.0` means domain `0000`), `numa<N>` (host memory on NUMA node N, and
//! device memory of a function on that node that has no rule of its own), or `*` (any memory
//! without a rule of its own, unknown places included). Spaces around the parts are ignored:
//!
//! ```text
//! GPU_RDMA_NICS="0000:22:00.0=rxe1,rxe3; numa0=rxe0; *=rxe2"
//! ```

use crate::near::Near;
use crate::pci;
use std::fmt;
use std::str::FromStr;

/// The environment variable read by [`NicOverride::from_environment`].
pub const NICS_ENV: &str = "GPU_RDMA_NICS";

/// One rule's place.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Place {
    Pci(String),
    Numa(u32),
    Any,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Pci(a) => f.write_str(a),
            Place::Numa(n) => write!(f, "numa{n}"),
            Place::Any => f.write_str("*"),
        }
    }
}

/// Per place of memory, the NICs to rank first (see the module's syntax). Parse it with
/// `"0000:22:00.0=rxe1,rxe3;*=rxe0".parse::<NicOverride>()`; it prints back in the same
/// syntax.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NicOverride {
    rules: Vec<(Place, Vec<String>)>,
}

/// Text that is not a NIC override: the offending part and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverrideError {
    /// The part of the text refused (a rule, a place or a NIC name).
    pub part: String,
    /// Why.
    pub why: String,
}

impl fmt::Display for OverrideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?}: {} (expected rules such as \"0000:22:00.0=rxe1,rxe3;numa0=rxe0;*=rxe2\")",
            self.part, self.why
        )
    }
}

impl std::error::Error for OverrideError {}

fn refuse(part: &str, why: impl Into<String>) -> OverrideError {
    OverrideError {
        part: part.to_string(),
        why: why.into(),
    }
}

fn parse_place(text: &str) -> Result<Place, OverrideError> {
    if text == "*" {
        return Ok(Place::Any);
    }
    if let Some(n) = text.strip_prefix("numa") {
        return n
            .parse::<u32>()
            .map(Place::Numa)
            .map_err(|_| refuse(text, "a NUMA node is `numa` and its number, as numa0"));
    }
    let lower = text.to_ascii_lowercase();
    let full = if lower.len() == 7 {
        format!("0000:{lower}")
    } else {
        lower
    };
    if pci::is_address(&full) {
        Ok(Place::Pci(full))
    } else {
        Err(refuse(
            text,
            "not a place: a PCI address (0000:22:00.0), numa<N> or *",
        ))
    }
}

impl FromStr for NicOverride {
    type Err = OverrideError;

    fn from_str(text: &str) -> Result<NicOverride, OverrideError> {
        let mut rules: Vec<(Place, Vec<String>)> = Vec::new();
        for rule in text.split(';').map(str::trim).filter(|r| !r.is_empty()) {
            let Some((place, list)) = rule.split_once('=') else {
                return Err(refuse(rule, "a rule is <place>=<nic>[,<nic>...]"));
            };
            let place = parse_place(place.trim())?;
            if rules.iter().any(|(p, _)| *p == place) {
                return Err(refuse(rule, format!("a second rule for {place}")));
            }
            let mut nics: Vec<String> = Vec::new();
            for nic in list.split(',').map(str::trim) {
                if nic.is_empty() || nic.contains(|c: char| c.is_whitespace() || c == '=') {
                    return Err(refuse(
                        rule,
                        "a NIC name is not empty and has no space or `=`",
                    ));
                }
                if nics.iter().any(|n| n == nic) {
                    return Err(refuse(nic, format!("listed twice for {place}")));
                }
                nics.push(nic.to_string());
            }
            rules.push((place, nics));
        }
        Ok(NicOverride { rules })
    }
}

impl fmt::Display for NicOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (place, nics)) in self.rules.iter().enumerate() {
            let sep = if i == 0 { "" } else { ";" };
            write!(f, "{sep}{place}={}", nics.join(","))?;
        }
        Ok(())
    }
}

impl NicOverride {
    /// The override in the environment variable [`NICS_ENV`] (`GPU_RDMA_NICS`); `Ok(None)`
    /// when it is unset or blank.
    ///
    /// # Errors
    /// Text that does not parse, or that is not UTF-8.
    pub fn from_environment() -> Result<Option<NicOverride>, OverrideError> {
        match std::env::var(NICS_ENV) {
            Ok(text) if text.trim().is_empty() => Ok(None),
            Ok(text) => text.parse().map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(t)) => {
                Err(refuse(&t.to_string_lossy(), "not UTF-8"))
            }
        }
    }

    /// Whether it has no rule.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rule for memory at `near` whose NUMA node is `numa` (if known): the place's own
    /// rule (a PCI address's, or a node's for host memory), else the node's, else `*`. Its
    /// place as written and its NICs.
    pub fn rule_for(&self, near: &Near, numa: Option<u32>) -> Option<(String, &[String])> {
        let find = |want: &Place| {
            self.rules
                .iter()
                .find(|(p, _)| p == want)
                .map(|(p, nics)| (p.to_string(), nics.as_slice()))
        };
        let own = match near {
            Near::Pci(a) => find(&Place::Pci(a.to_ascii_lowercase())),
            Near::Numa(n) => find(&Place::Numa(*n)),
            Near::Unknown => None,
        };
        own.or_else(|| numa.and_then(|n| find(&Place::Numa(n))))
            .or_else(|| find(&Place::Any))
    }
}
