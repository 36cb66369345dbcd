//! `cargo xtask soak`: the demo N times in a row (and optionally the whole test suite), with
//! a CPU hog on every host core if asked, counting failures, emulator faults and second
//! boots. It proves that the testbed holds on a busy machine, as CI runners and newcomers'
//! laptops often are.

use crate::{demo, testrun};
use dmabuf_testbed::sh::Result;
use dmabuf_testbed::ui::info;
use dmabuf_testbed::{fail, programs, setup};
use gpu_rdma_bench::workspace::Paths;
use std::process::{Child, ExitCode};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    /// Demo runs.
    demos: u32,
    /// A CPU hog on every host core while they run.
    hog: bool,
    /// `cargo xtask test` after the demos, under the same hog.
    test: bool,
}

fn parse(args: &[String]) -> Result<Plan> {
    let mut plan = Plan {
        demos: 10,
        hog: false,
        test: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--demo" => {
                plan.demos = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--demo takes a number of runs")?
            }
            "--hog" => plan.hog = true,
            "--test" => plan.test = true,
            other => {
                fail!("unknown option `{other}` (cargo xtask soak [--demo N] [--hog] [--test])")
            }
        }
    }
    Ok(plan)
}

/// A `stress-ng` CPU hog, one worker per online host core, stopped when this drops (and by
/// its own `--timeout` should this process die first).
struct Hog(Child);

impl Hog {
    fn start(limit: Duration) -> Result<Hog> {
        let child = programs::cmd("stress-ng")
            .args(["--cpu", "0", "--cpu-load", "100", "--quiet"])
            .arg("--timeout")
            .arg(format!("{}s", limit.as_secs().max(1)))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start stress-ng: {e} (run `cargo xtask setup`)"))?;
        Ok(Hog(child))
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        // stress-ng's workers die with their parent (it sets their parent-death signal).
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The host's 1-minute load average.
fn load() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Runs the soak; fails unless every demo passed with no emulator fault and no second boot
/// (and the test suite passed, with `--test`).
pub fn main(paths: &Paths, args: &[String]) -> Result<ExitCode> {
    let plan = parse(args)?;
    setup::packages()?;
    let argv = demo::prepare(paths)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let _hog = if plan.hog {
        // A backstop far past any sane soak: the hog also stops when this process does.
        let hog = Hog::start(Duration::from_secs(
            600 * u64::from(plan.demos) + if plan.test { 7200 } else { 0 },
        ))?;
        info(format!(
            "hog: stress-ng --cpu 0 (one busy worker per core, {cores} cores), pid {}",
            hog.0.id()
        ));
        Some(hog)
    } else {
        None
    };
    let (mut passed, mut failed, mut faults, mut reboots) = (0, 0, 0, 0);
    let (mut lo, mut hi) = (f64::MAX, 0f64);
    let started = Instant::now();
    for i in 1..=plan.demos {
        let t = Instant::now();
        let out = demo::run(paths, &argv, false)?;
        let l = load();
        (lo, hi) = (lo.min(l), hi.max(l));
        faults += out.faults;
        reboots += usize::from(out.rebooted);
        if out.passed {
            passed += 1;
        } else {
            failed += 1;
        }
        info(format!(
            "soak demo {i}/{}: {} in {:.0} s, load {l:.1}{}{}; {}",
            plan.demos,
            if out.passed { "passed" } else { "FAILED" },
            t.elapsed().as_secs_f64(),
            if out.faults > 0 {
                format!(", {} emulator fault(s)", out.faults)
            } else {
                String::new()
            },
            if out.rebooted { ", booted twice" } else { "" },
            out.rate
        ));
    }
    let mut ok = failed == 0 && faults == 0 && reboots == 0;
    println!(
        "soak: {} demos{}: {passed} passed, {failed} failed, {faults} emulator faults, \
         {reboots} second boots; load average {:.1} to {:.1}; {:.0} s",
        plan.demos,
        if plan.hog { " under a CPU hog" } else { "" },
        if lo == f64::MAX { 0.0 } else { lo },
        hi,
        started.elapsed().as_secs_f64()
    );
    if plan.test {
        info("cargo xtask test, under the same conditions");
        ok &= testrun::main(paths, &[])? == ExitCode::SUCCESS;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse(&args(&["--demo", "30", "--hog"])).unwrap(),
            Plan {
                demos: 30,
                hog: true,
                test: false
            }
        );
        assert!(parse(&args(&["--demo"])).is_err());
        assert!(parse(&args(&["--fast"])).is_err());
    }
}
