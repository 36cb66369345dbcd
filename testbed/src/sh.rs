//! Running host commands with errors that say what failed.

use std::path::Path;
use std::process::{Command, Stdio};

/// The error of the testbed and xtask: a message for a person.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// Their result.
pub type Result<T = ()> = std::result::Result<T, Error>;

/// Returns early from the enclosing function with an [`Error`] built from a formatted message.
#[macro_export]
macro_rules! fail {
    ($($arg:tt)*) => { return Err(format!($($arg)*).into()) };
}

/// Renders a command for messages.
pub fn render(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` with inherited output; fails unless it exits 0.
pub fn run(cmd: &mut Command) -> Result {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start `{}`: {e}", render(cmd)))?;
    if !status.success() {
        fail!("`{}` failed: {status}", render(cmd));
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout; fails unless it exits 0.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start `{}`: {e}", render(cmd)))?;
    if !out.status.success() {
        fail!("`{}` failed: {}", render(cmd), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `cmd` and returns its stdout, holding its stderr back: shown (its last lines) only in
/// the error when it fails. For tools whose progress is noise to the testbed's user (cargo's
/// "Downloading crates ...").
pub fn output_quiet(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot start `{}`: {e}", render(cmd)))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        fail!("`{}` failed: {}\n{tail}", render(cmd), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Quotes one word for a POSIX shell.
pub fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // The effective uid without unsafe code: /proc/self/status's "Uid:" line.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Writes `text` to `path`, creating parent folders.
pub fn write(path: &Path, text: &str) -> Result {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn a_quiet_command_shows_its_stderr_only_when_it_fails() {
        use crate::programs::shell;
        let ok = super::output_quiet(&mut shell("echo out; echo noise >&2").unwrap());
        assert_eq!(ok.unwrap(), "out\n");
        let e = super::output_quiet(&mut shell("echo why >&2; exit 3").unwrap());
        let e = e.unwrap_err().to_string();
        assert!(e.contains("failed") && e.ends_with("\nwhy"), "{e}");
    }

    #[test]
    fn quote_escapes_single_quotes() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
