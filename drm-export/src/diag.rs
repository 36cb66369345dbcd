//! Notices on standard error from drops, which must never panic (`eprintln!` panics when
//! stderr is a closed pipe); the crate denies `clippy::print_stderr`.

/// Writes `drm-export: <args>` and a newline to stderr, ignoring any error.
pub(crate) fn warn(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let write = || drop(writeln!(std::io::stderr(), "drm-export: {args}"));
    std::mem::forget(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
        write,
    )));
}
