//! The report as text.

use crate::{Check, Report, Status};
use std::fmt::Write as _;

fn tag(s: Status) -> String {
    format!("[{}]", s.label())
}

/// `checks` grouped by section (a heading line before each), one line each (`[ok]`,
/// `[warn]`, `[fail]`, name, what was found) and its fix below it.
pub(crate) fn check_lines(checks: &[Check]) -> String {
    let mut out = String::new();
    let mut section = "";
    for c in checks {
        if c.section != section {
            section = c.section;
            let _ = writeln!(out, "\n{section}");
        }
        let _ = writeln!(out, "  {:<6} {}: {}", tag(c.status), c.name, c.found);
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "         fix: {fix}");
        }
    }
    out
}

/// Checks grouped by section, the matrix as a grid (one column per NIC), then the verdict.
pub fn text(r: &Report) -> String {
    let mut out = String::from("gpu-rdma-doctor: can this machine register GPU memory for RDMA?\n");
    out.push_str(&check_lines(&r.checks));
    if !r.matrix.is_empty() {
        let mut nics: Vec<&str> = r.matrix.iter().map(|m| m.nic.as_str()).collect();
        nics.dedup();
        let nics: Vec<&str> = nics
            .iter()
            .enumerate()
            .filter(|(i, n)| !nics[..*i].contains(n))
            .map(|(_, n)| *n)
            .collect();
        let _ = writeln!(
            out,
            "\nregistration matrix (buffer source x placement x NIC)"
        );
        let _ = write!(out, "  {:<18} {:<22} {:<10}", "source", "node", "placement");
        for n in &nics {
            let _ = write!(out, " {n:<10}");
        }
        out.push('\n');
        let mut seen: Vec<(&str, &str, &str)> = Vec::new();
        for m in &r.matrix {
            let key = (m.source.as_str(), m.node.as_str(), m.placement.as_str());
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            let _ = write!(out, "  {:<18} {:<22} {:<10}", key.0, key.1, key.2);
            for n in &nics {
                let cell = r
                    .matrix
                    .iter()
                    .find(|x| {
                        (x.source.as_str(), x.node.as_str(), x.placement.as_str()) == key
                            && x.nic == *n
                    })
                    .map_or("-", |x| if x.registered { "ok" } else { "fail" });
                let _ = write!(out, " {cell:<10}");
            }
            out.push('\n');
        }
        for m in r.matrix.iter().filter(|m| !m.registered) {
            let _ = writeln!(
                out,
                "  {} {} on {}: {}",
                m.source, m.placement, m.nic, m.detail
            );
        }
    }
    let _ = writeln!(
        out,
        "\nverdict {} {}",
        tag(r.verdict.status),
        r.verdict.line
    );
    out
}
