//! `cargo xtask test` and `cargo xtask demo`.
use crate::sh::Result;
use crate::Paths;
use std::process::ExitCode;

/// Placeholder until the runner lands.
pub fn main(_paths: &Paths, _args: &[String]) -> Result<ExitCode> {
    Ok(ExitCode::FAILURE)
}

/// Placeholder until the demo lands.
pub fn demo(_paths: &Paths) -> Result<ExitCode> {
    Ok(ExitCode::FAILURE)
}
