//! Notices on standard error that never panic: `eprintln!` panics when stderr is a closed
//! pipe, and a notice is printed from drops and drains, where a panic would unwind past
//! memory the NIC owns. The crate denies `clippy::print_stderr`, so this is the only way out.

use std::io::Write;

/// Writes `rdma-dmabuf: <args>` and a newline to stderr; any error (or panic while
/// formatting) is dropped.
pub(crate) fn warn(args: std::fmt::Arguments<'_>) {
    let write = || drop(writeln!(std::io::stderr(), "rdma-dmabuf: {args}"));
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(write)) {
        std::mem::forget(p);
    }
}
