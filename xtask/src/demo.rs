//! `cargo xtask demo`, the README's main command: `gpu_rdma_write` across the two-node
//! testbed, GPU (vgem) buffer to GPU buffer through dma-buf memory regions on patched rxe.

use crate::script;
use dmabuf_testbed::sh::Result;
use dmabuf_testbed::ui::info;
use dmabuf_testbed::{programs, setup, vm};
use gpu_rdma_bench::workspace::Paths;
use std::process::ExitCode;

// The GPU buffer on each side, and how many times the client writes all of it.
const SIZE: &str = "64M";
const ITERS: &str = "1";
// How long either side waits without progress (connecting, for the last write, for the
// verdict) before it gives up: an emulated node on a busy host can be slow, not dead.
const WAIT_SECS: &str = "300";

/// One demo run's outcome.
pub struct Outcome {
    /// Both sides exited 0 with clean kernels and reported `verified=yes`.
    pub passed: bool,
    /// Boots that showed an emulator fault (the first, and the second if it did too).
    pub faults: usize,
    /// The first boot hit an emulator fault and the demo was booted once more.
    pub rebooted: bool,
    /// The client's throughput line, if it reported one.
    pub rate: String,
}

/// Sets up, builds the example, runs it on both nodes and prints each side's report.
pub fn main(paths: &Paths) -> Result<ExitCode> {
    let argv = prepare(paths)?;
    info("node a serves, node b writes; each allocates a vgem buffer, exports it as a dma-buf");
    info("and registers it with ibv_reg_dmabuf_mr on its rxe device");
    let out = run(paths, &argv, true)?;
    if out.passed {
        println!(
            "demo PASSED: the {} GPU buffer was written {} across the wire and the server \
             verified every byte; {}",
            SIZE.replace('M', " MiB"),
            if ITERS == "1" {
                "once".to_string()
            } else {
                format!("{ITERS} times")
            },
            out.rate
        );
        println!(
            "(soft-RoCE between emulated VMs: the figure shows that the path works, not what \
             a NIC does; see docs/hardware.md)"
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!("demo FAILED (see above)");
        Ok(ExitCode::FAILURE)
    }
}

/// Installs what is missing, builds the example and writes the script; returns the command
/// both nodes run.
pub fn prepare(paths: &Paths) -> Result<Vec<String>> {
    setup::packages()?;
    let binary = paths.release_example("gpu_rdma_write")?;
    let file = paths.testbed.join("demo.sh");
    programs::write_script(&file, script::DEMO)?;
    Ok(vec![
        "sh".into(),
        file.display().to_string(),
        binary.display().to_string(),
        SIZE.into(),
        ITERS.into(),
        WAIT_SECS.into(),
    ])
}

/// Boots the two-node testbed once with `argv` (from [`prepare`]), once more after an
/// emulator fault; prints both sides' reports when `print`.
pub fn run(paths: &Paths, argv: &[String], print: bool) -> Result<Outcome> {
    let opts = vm::Opts {
        nodes: 2,
        expose: paths.vm_expose(),
        env: paths.cluster_env()?,
        ..vm::Opts::default()
    };
    let (results, rebooted) = vm::run_past_emulator_fault(paths, argv, &opts, false)?;
    if rebooted {
        info(
            "(the first boot hit an emulator fault, not a fault of the demo: see docs/testbed.md)",
        );
    }
    let passed = results.iter().all(|r| {
        r.ok()
            && r.console
                .lines()
                .any(|l| l.starts_with("RESULT") && l.contains("verified=yes"))
    });
    if print || !passed {
        report(&results);
    }
    let rate = results
        .iter()
        .find(|r| r.node == 'b')
        .and_then(|r| r.console.lines().find(|l| l.contains("throughput")))
        .map(|l| l.trim().trim_start_matches("throughput").trim().to_string())
        .unwrap_or_default();
    let faults = usize::from(rebooted)
        + results
            .iter()
            .filter(|r| r.emulator_fault.is_some())
            .count()
            .min(1);
    Ok(Outcome {
        passed,
        faults,
        rebooted,
        rate,
    })
}

/// Prints each side's report (or its whole console when it failed).
fn report(results: &[vm::NodeResult]) {
    println!();
    for r in results {
        let role = if r.node == 'a' { "server" } else { "client" };
        println!("── node {} ({role}) ──", r.node);
        match section(&r.console) {
            Some(lines) if r.ok() => println!("{lines}"),
            _ => println!("{}", r.console.trim_end()),
        }
        for p in &r.problems {
            println!("  kernel problem: {p}");
        }
        if r.status != Some(0) {
            println!("  exit status: {:?}", r.status);
        }
        println!();
    }
}

/// The lines the script printed between its markers (the kernel's console lines left out).
fn section(console: &str) -> Option<String> {
    let start = console.find("@@@ begin")?;
    let rest = &console[start..];
    let end = rest.find("@@@ end")?;
    let body: Vec<&str> = rest[..end]
        .lines()
        .skip(1)
        .filter(|l| !is_kernel_line(l))
        .collect();
    let head = rest
        .lines()
        .next()?
        .trim_start_matches("@@@ begin ")
        .to_string();
    Some(format!("  {head}\n{}", body.join("\n")))
}

/// `[   10.732347] ...`
fn is_kernel_line(l: &str) -> bool {
    l.strip_prefix('[')
        .and_then(|r| r.split_once(']'))
        .is_some_and(|(t, _)| t.trim().parse::<f64>().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_scripts_lines_only() {
        let console = "boot noise\n@@@ begin node a: kernel 6.1.0\ngpu_rdma_write server\n\
                       [   10.7] rxe: something\n  verified  PASSED\n@@@ end\n[ 11.0] reboot\n";
        assert_eq!(
            section(console).unwrap(),
            "  node a: kernel 6.1.0\ngpu_rdma_write server\n  verified  PASSED"
        );
        assert_eq!(section("no markers"), None);
    }
}
