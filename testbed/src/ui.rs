//! Progress output: every long step says what it does and how long it took.

use std::time::Instant;

/// A named step whose duration is printed when it ends.
pub struct Step {
    name: String,
    start: Instant,
}

impl Step {
    /// Announces `name` and starts its clock.
    pub fn start(name: impl Into<String>) -> Step {
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

/// Prints an informational line, indented under the steps.
pub fn info(msg: impl AsRef<str>) {
    eprintln!("    {}", msg.as_ref());
}
