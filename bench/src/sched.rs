//! `cargo xtask bench --sched-trace`: the one-node ping-pongs (perftest's `ib_write_lat`,
//! `rdma_bench --mode lat` and `--mode lat-poll`, host region) under each scheduler setting,
//! every run traced with the guest kernel's scheduler and workqueue tracepoints
//! (`scripts/sched.sh`); per run, the round trip's median and how often rxe's kworkers waited a
//! scheduler tick or more to run ([`crate::trace`]). docs/performance.md, "One-node latency and
//! the scheduler", reads the figures.

use crate::trace::analyse;
use crate::workspace::Paths;
use dmabuf_testbed::sh::Result;
use dmabuf_testbed::ui::info;
use dmabuf_testbed::{fail, programs, vm};

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What `--sched-trace` was asked.
#[derive(Debug, PartialEq)]
struct Request {
    runs: u32,
    iters: u32,
    size: u64,
    settings: Vec<String>,
    /// Busy threads on the host during the boot (load that provokes the stalls).
    host_load: u32,
    /// Debian's own rxe and rdma-core instead of the patched stack (host regions need no patch).
    stock: bool,
    /// Read a previous run's folder instead of booting.
    report: Option<PathBuf>,
}

/// The settings `/sys/kernel/debug/sched/features` takes that this command knows.
const SETTINGS: &[&str] = &["RUN_TO_PARITY", "NO_RUN_TO_PARITY"];

fn parse_args(args: &[String]) -> Result<Request> {
    let mut r = Request {
        runs: 5,
        iters: 300,
        size: 2,
        settings: SETTINGS.iter().map(|s| s.to_string()).collect(),
        host_load: 0,
        stock: false,
        report: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value"))
        };
        let mut count = |max: u64| -> Result<u64> {
            let v = value()?;
            match v.parse::<u64>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => fail!("{a} {v:?}: a count from 1 to {max}"),
            }
        };
        match a.as_str() {
            "--runs" => r.runs = count(50)? as u32,
            "--iters" => r.iters = count(100_000)? as u32,
            "--size" => r.size = count(1 << 20)?,
            "--host-load" => r.host_load = count(16)? as u32,
            "--stock" => r.stock = true,
            "--report" => r.report = Some(PathBuf::from(value()?)),
            "--settings" => {
                let v = value()?;
                r.settings = v.split(',').map(String::from).collect();
                if let Some(s) = r.settings.iter().find(|s| !SETTINGS.contains(&s.as_str())) {
                    fail!("--settings: {s:?} is not one of {SETTINGS:?}");
                }
            }
            other => fail!(
                "unknown --sched-trace option {other:?} (--runs N, --iters N, --size B, \
                 --settings RUN_TO_PARITY,NO_RUN_TO_PARITY, --host-load THREADS, --stock, \
                 --report DIR)"
            ),
        }
    }
    Ok(r)
}

/// Boots the one-node testbed, runs the traced ping-pongs, saves console and traces under
/// `target/bench/sched-<time>/` and prints the report (or only reads a folder: `--report`).
pub fn main(paths: &Paths, args: &[String]) -> Result<ExitCode> {
    let req = parse_args(args)?;
    let tick_ns = 1_000_000_000 / kernel_hz(&paths.testbed);
    if let Some(dir) = &req.report {
        return report(dir, tick_ns);
    }
    let bench = paths.release_example("rdma_bench")?;
    let script_file = paths.testbed.join("sched.sh");
    programs::write_script(&script_file, crate::script::SCHED)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let out = paths.target.join("bench").join(format!("sched-{stamp}"));
    std::fs::create_dir_all(&out)?;
    let argv: Vec<String> = vec![
        "sh".into(),
        script_file.display().to_string(),
        bench.display().to_string(),
        req.runs.to_string(),
        req.iters.to_string(),
        req.size.to_string(),
        req.settings.join(" "),
    ];
    let runs = req.runs as u64 * req.settings.len() as u64 * 3;
    let opts = vm::Opts {
        nodes: 1,
        mode: if req.stock {
            vm::Mode::Stock
        } else {
            vm::Mode::Patched
        },
        timeout: Duration::from_secs(300 + runs * 150),
        expose: paths.vm_expose(),
        env: paths.cluster_env()?,
        writable_cwd: true,
        ..vm::Opts::default()
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    info(format!(
        "{runs} traced runs; host load average at the start: {}; {} busy host threads beside",
        load.split(' ').take(3).collect::<Vec<_>>().join(" "),
        req.host_load
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..req.host_load)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            })
        })
        .collect();
    // The guest writes its traces into its working folder, shared writable.
    let here = std::env::current_dir()?;
    std::env::set_current_dir(&out)?;
    let results = vm::run(paths, &argv, &opts);
    std::env::set_current_dir(here)?;
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        let _ = s.join();
    }
    let results = results?;
    let console = results.first().map(|r| r.console.as_str()).unwrap_or("");
    std::fs::write(out.join("console.txt"), console)?;
    info(format!("console and traces in {}", out.display()));
    let code = report(&out, tick_ns)?;
    Ok(if results.iter().all(vm::NodeResult::ok) {
        code
    } else {
        ExitCode::FAILURE
    })
}

/// The guest kernel's `CONFIG_HZ` from its config in the testbed's cache (250 when not found:
/// Debian's).
fn kernel_hz(cache: &Path) -> u64 {
    let configs = std::fs::read_dir(cache.join("kernel"))
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|k| {
            std::fs::read_dir(k.path().join("boot"))
                .into_iter()
                .flatten()
        })
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().starts_with("config-"));
    for f in configs {
        let text = std::fs::read_to_string(f.path()).unwrap_or_default();
        if let Some(hz) = text
            .lines()
            .find_map(|l| l.strip_prefix("CONFIG_HZ=")?.parse().ok())
            .filter(|&hz: &u64| hz > 0)
        {
            return hz;
        }
    }
    250
}

/// One run as the console tells it.
#[derive(Debug, PartialEq)]
pub struct Run {
    /// `PROGRAM.SETTING.N`.
    pub id: String,
    /// The round trip's median (perftest's `t_typical`, rdma_bench's `typ_usec`), microseconds.
    pub median_us: Option<f64>,
    /// The client's and the server's exit statuses, as the script printed them.
    pub status: String,
}

/// The runs of a console: `### run ID begin`, the client's output, `### run ID end ...`.
pub fn runs(console: &str) -> Vec<Run> {
    let mut v = Vec::new();
    let mut open: Option<(String, Option<f64>)> = None;
    for line in console.lines() {
        let l = line.trim();
        if let Some(id) = l
            .strip_prefix("### run ")
            .and_then(|r| r.strip_suffix(" begin"))
        {
            open = Some((id.to_string(), None));
        } else if let Some(rest) = l.strip_prefix("### run ") {
            if let Some((id, median)) = open.take() {
                let status = rest.strip_prefix(id.as_str()).unwrap_or(rest);
                let status = status.trim().trim_start_matches("end").trim().to_string();
                v.push(Run {
                    id,
                    median_us: median,
                    status,
                });
            }
        } else if let Some((id, median)) = open.as_mut() {
            if let Some(x) = median_of(id, l) {
                *median = Some(x);
            }
        }
    }
    v
}

/// The median in one line of a client's output, if it is the line that has it.
fn median_of(id: &str, line: &str) -> Option<f64> {
    if id.starts_with("perftest.") {
        // #bytes #iterations t_min[usec] t_max[usec] t_typical[usec] ...
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() >= 6 && cols[..2].iter().all(|c| c.parse::<u64>().is_ok()) {
            return cols[4].parse().ok();
        }
        None
    } else {
        let r = line.strip_prefix("RESULT ")?;
        crate::trace::field(r, "typ_usec")?.parse().ok()
    }
}

/// Prints a folder's runs (console and traces) and the totals per program and setting.
fn report(dir: &Path, tick_ns: u64) -> Result<ExitCode> {
    let console = std::fs::read_to_string(dir.join("console.txt"))
        .map_err(|e| format!("{}: {e}", dir.join("console.txt").display()))?;
    let runs = runs(&console);
    if runs.is_empty() {
        fail!("{}: no run in the console", dir.display());
    }
    println!(
        "tick: {:.1} ms. Per run: waits: rxe's kworkers made runnable (woken or preempted);\n\
         >=1ms, >=tick: those that waited so long to run; of those >= 1 tick: remote: woken \
         from the other CPU;\n\
         ipi: their wake-up sent that CPU a reschedule IPI; ipi->irq: median ms from sending \
         it to that CPU's handler;\n\
         total, max: their waits; meanwhile: what ran on their CPU. work: rxe's work items \
         that waited >= 1 tick to start.",
        tick_ns as f64 / 1e6
    );
    println!(
        "{:<32} {:>10} {:>6} {:>6} {:>6} {:>6} {:>4} {:>8} {:>9} {:>7} {:>5} {:>9}  meanwhile on \
         that CPU",
        "run",
        "median us",
        "waits",
        ">=1ms",
        ">=tick",
        "remote",
        "ipi",
        "ipi->irq",
        "total ms",
        "max ms",
        "work",
        "status"
    );
    let mut totals: Vec<(String, u32, u32, u64, u64)> = Vec::new();
    // A run that failed or left no trace is named, and fails the command: zero waits read
    // from a missing trace would look like a run without a stall.
    let mut failed = Vec::new();
    for r in &runs {
        let file = dir.join(format!("trace-{}.txt", r.id));
        let s = match std::fs::read_to_string(&file) {
            Ok(t) => analyse(&t),
            Err(e) => {
                println!("{:<32} no trace ({e}); status {}", r.id, r.status);
                failed.push(r.id.clone());
                continue;
            }
        };
        if r.status != "client=0 server=0" {
            failed.push(r.id.clone());
        }
        let long: Vec<_> = s.long_waits(tick_ns).collect();
        let (ipis, taken) = s.ipis(tick_ns);
        let total: u64 = long.iter().map(|w| w.ns).sum();
        let max = long.iter().map(|w| w.ns).max().unwrap_or(0);
        let occupant = s
            .main_occupant(tick_ns)
            .map(|(c, ns)| format!("{c} ({:.1} ms)", ns as f64 / 1e6))
            .unwrap_or_default();
        println!(
            "{:<32} {:>10} {:>6} {:>6} {:>6} {:>6} {:>4} {:>8} {:>9.1} {:>7.1} {:>5} {:>9}  {}",
            r.id,
            r.median_us.map_or("-".into(), |m| format!("{m:.1}")),
            s.waits.len(),
            s.long_waits(1_000_000).count(),
            long.len(),
            s.remote_wakes(tick_ns),
            ipis,
            taken
                .get(taken.len() / 2)
                .map_or("-".into(), |t| format!("{:.2}", *t as f64 / 1e6)),
            total as f64 / 1e6,
            max as f64 / 1e6,
            s.long_work_delays(tick_ns),
            r.status.replace("client=", "c=").replace(" server=", ",s="),
            occupant
        );
        let group =
            r.id.rsplit_once('.')
                .map_or(r.id.as_str(), |g| g.0)
                .to_string();
        let stuck = r
            .median_us
            .is_some_and(|m| m * 1000.0 >= tick_ns as f64 / 2.0);
        let i = match totals.iter().position(|t| t.0 == group) {
            Some(i) => i,
            None => {
                totals.push((group, 0, 0, 0, 0));
                totals.len() - 1
            }
        };
        let t = &mut totals[i];
        t.1 += 1;
        t.2 += u32::from(stuck);
        t.3 += long.len() as u64;
        t.4 += total;
    }
    println!("\nper program and setting (stuck: median >= half a tick)");
    for (g, n, stuck, waits, total) in totals {
        println!(
            "{g:<32} runs {n:>3}  stuck {stuck:>3}  waits >= 1 tick {waits:>5}  ({:.1} ms)",
            total as f64 / 1e6
        );
    }
    if !failed.is_empty() {
        println!("failed runs (no trace, or a program's non-zero status): {failed:?}");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
#[path = "sched_tests.rs"]
mod tests;
