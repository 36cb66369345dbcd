//! `cargo xtask demo`, the README's main command: `gpu_rdma_write` across the two-node
//! testbed, GPU (vgem) buffer to GPU buffer through dma-buf memory regions on patched rxe.

use crate::sh::Result;
use crate::ui::info;
use crate::{programs, script, setup, vm, Paths};
use std::process::ExitCode;

// The GPU buffer on each side, and how many times the client writes all of it.
const SIZE: &str = "8M";
const ITERS: &str = "4";

/// Sets up, builds the example, runs it on both nodes and prints each side's report.
pub fn main(paths: &Paths) -> Result<ExitCode> {
    setup::packages()?;
    let binary = paths.release_example("gpu_rdma_write")?;
    let file = paths.testbed.join("demo.sh");
    programs::write_script(&file, script::DEMO)?;
    let argv: Vec<String> = vec![
        "sh".into(),
        file.display().to_string(),
        binary.display().to_string(),
        SIZE.into(),
        ITERS.into(),
    ];
    info("node a serves, node b writes; each allocates a vgem buffer, exports it as a dma-buf");
    info("and registers it with ibv_reg_dmabuf_mr on its rxe device");
    let opts = vm::Opts {
        nodes: 2,
        ..vm::Opts::default()
    };
    let (results, rebooted) = vm::run_past_emulator_fault(paths, &argv, &opts, false)?;
    if rebooted {
        info(
            "(the first boot hit an emulator fault, not a fault of the demo: see docs/testbed.md)",
        );
    }
    println!();
    for r in &results {
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
    let verified = results.iter().all(|r| {
        r.ok()
            && r.console
                .lines()
                .any(|l| l.starts_with("RESULT") && l.contains("verified=yes"))
    });
    if verified {
        let client = results.iter().find(|r| r.node == 'b');
        let rate = client
            .and_then(|r| r.console.lines().find(|l| l.contains("throughput")))
            .map(|l| l.trim().trim_start_matches("throughput").trim().to_string())
            .unwrap_or_default();
        println!(
            "demo PASSED: the {} GPU buffer was written {ITERS} times across the wire and \
             the server verified every byte; {rate}",
            SIZE.replace('M', " MiB")
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
