//! Progress output: every long step says what it does and how long it took.

use std::sync::Mutex;
use std::time::Instant;

/// The names of the work steps ([`Step::start`]) this process started, in order: what it
/// downloaded and built (`setup` reports them; [`work_since`]).
static WORK: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A named step whose duration is printed when it ends.
pub struct Step {
    name: String,
    start: Instant,
}

impl Step {
    /// Announces `name`, a piece of work (a download, a build), and starts its clock; the
    /// name is recorded for [`work_since`].
    pub fn start(name: impl Into<String>) -> Step {
        let step = Step::check(name);
        if let Ok(mut w) = WORK.lock() {
            w.push(step.name.clone());
        }
        step
    }

    /// Announces `name`, a check that builds nothing (the host's packages, the KVM probe),
    /// and starts its clock; not recorded as work.
    pub fn check(name: impl Into<String>) -> Step {
        let name = name.into();
        eprintln!("==> {name} ...");
        Step {
            name,
            start: Instant::now(),
        }
    }

    /// Prints the step's duration.
    pub fn done(self) {
        eprintln!(
            "==> {} done in {:.1} s",
            self.name,
            self.start.elapsed().as_secs_f64()
        );
    }

    /// Prints the step's duration with a remark (e.g. "cached").
    pub fn done_with(self, remark: &str) {
        eprintln!(
            "==> {} {remark} ({:.1} s)",
            self.name,
            self.start.elapsed().as_secs_f64()
        );
    }
}

/// How many work steps this process has started so far: a mark for [`work_since`].
pub fn work_mark() -> usize {
    WORK.lock().map(|w| w.len()).unwrap_or(0)
}

/// The names of the work steps started since `mark` ([`work_mark`]).
pub fn work_since(mark: usize) -> Vec<String> {
    WORK.lock()
        .map(|w| w.get(mark..).unwrap_or_default().to_vec())
        .unwrap_or_default()
}

/// Prints an informational line, indented under the steps.
pub fn info(msg: impl AsRef<str>) {
    eprintln!("    {}", msg.as_ref());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_steps_are_recorded_and_checks_are_not() {
        let mark = work_mark();
        Step::check("checking something").done();
        Step::start("building something").done();
        let since = work_since(mark);
        // Other tests of this binary may start steps meanwhile: ours is there, the check not.
        assert!(since.iter().any(|s| s == "building something"), "{since:?}");
        assert!(
            !since.iter().any(|s| s == "checking something"),
            "{since:?}"
        );
        assert!(work_since(usize::MAX).is_empty());
    }
}
