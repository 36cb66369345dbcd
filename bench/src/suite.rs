//! The default run, `cargo xtask bench` without a mode: the series of `series` at the sizes
//! and rounds of `plan`, one boot per node count; the tables, goals and gates, the JSON file
//! with every sample and the plots, under `target/bench/`.

use crate::plan::{self, Profile};
use crate::results::{self, spreads, Failure, Sample, Spread};
use crate::series::{self, Metric, GOALS, SERIES};
use crate::units::nodes_name;
use crate::workspace::Paths;
use crate::{gates, ins, json, loadavg, plot, script, table};
use dmabuf_testbed::sh::Result;
use dmabuf_testbed::ui::info;
use dmabuf_testbed::{fail, programs, vm};

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// What `cargo xtask bench` was asked.
#[derive(Debug, PartialEq)]
struct Request {
    quick: bool,
    /// Node counts to boot, in order.
    nodes: Vec<u8>,
    rounds: Option<u32>,
    sizes: Option<Vec<u64>>,
    /// `--only`: series name prefixes.
    only: Vec<String>,
    /// Redraw the plots of a run's JSON file instead of running.
    replot: Option<PathBuf>,
}

/// `--quick`, `--nodes 1|2|both`, `--rounds N`, `--sizes 8,64K,1M`, `--only perftest,engine`.
fn parse_args(args: &[String]) -> Result<Request> {
    let mut r = Request {
        quick: false,
        nodes: Vec::new(),
        rounds: None,
        sizes: None,
        only: Vec::new(),
        replot: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |what: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs {what}"))
        };
        match a.as_str() {
            "--quick" => r.quick = true,
            "--nodes" => {
                r.nodes = match value("1, 2 or both")?.as_str() {
                    "1" => vec![1],
                    "2" => vec![2],
                    "both" => vec![1, 2],
                    other => fail!("--nodes {other:?}: 1, 2 or both"),
                }
            }
            "--rounds" => {
                let v = value("a count")?;
                match v.parse::<u32>() {
                    Ok(n) if (1..=100).contains(&n) => r.rounds = Some(n),
                    _ => fail!("--rounds {v:?}: a count from 1 to 100"),
                }
            }
            "--sizes" => r.sizes = Some(plan::parse_sizes(&value("a list like 8,64K,1M")?)?),
            "--replot" => r.replot = Some(PathBuf::from(value("a bench.json")?)),
            "--only" => {
                let v = value("series names or their beginnings, like perftest,engine")?;
                r.only = v
                    .split(',')
                    .filter(|w| !w.is_empty())
                    .map(String::from)
                    .collect();
                let known = |o: &String| SERIES.iter().any(|s| s.name.starts_with(o.as_str()));
                if let Some(o) = r.only.iter().find(|o| !known(o)) {
                    fail!("--only {o:?}: no series name starts with it");
                }
                if r.only.is_empty() {
                    fail!("--only {v:?}: no series named");
                }
            }
            other => fail!(
                "unknown bench option {other:?} (--quick, --nodes 1|2|both, --rounds N, \
                 --sizes 8,64K,1M, --only perftest,engine, --replot FILE; or --rails first, \
                 then the step's --bytes N --rounds N --rails 1,2,4; or --sched-trace first)"
            ),
        }
    }
    if r.nodes.is_empty() {
        r.nodes = if r.quick { vec![1] } else { vec![1, 2] };
    }
    Ok(r)
}

impl Request {
    /// The profile of each boot.
    fn profiles(&self) -> Vec<Profile> {
        self.nodes
            .iter()
            .map(|&n| {
                let mut p = if self.quick {
                    Profile::quick(n)
                } else {
                    Profile::full(n)
                };
                if let Some(r) = self.rounds {
                    p.rounds = r;
                }
                p.only.clone_from(&self.only);
                if let Some(s) = &self.sizes {
                    p.sizes = s.clone();
                    p.cost_sizes.clone_from(&p.sizes);
                    p.cost_sizes.retain(|&s| n == 1 && s <= plan::COST_MAX);
                    if n > 1 {
                        p.sizes.retain(|&s| s <= plan::TWO_NODE_MAX);
                    }
                }
                p
            })
            .collect()
    }
}

/// Builds the bench (release), runs the plan in the testbed (one boot per node count),
/// prints the tables and goals, writes the JSON file and the plots under `target/bench/`.
pub fn main(paths: &Paths, args: &[String]) -> Result<ExitCode> {
    let req = parse_args(args)?;
    if let Some(file) = &req.replot {
        return replot(file, &paths.target.join("bench"));
    }
    let profiles = req.profiles();
    let bench = paths.release_example("rdma_bench")?;
    let engine = paths.release_example(series::ENGINE)?;
    // The Python package in release, when a profile's plan has the Python series.
    let python = profiles
        .iter()
        .flat_map(plan::steps)
        .any(|s| SERIES[s.series].program == series::PYTHON_ENGINE);
    let python = if python {
        crate::workspace::python::stage_release(paths)?
    } else {
        paths.target.join("release/python")
    };
    // The verbs crates' loops, when a profile's plan counts them.
    let crates = profiles
        .iter()
        .flat_map(plan::steps)
        .any(|s| series::VERBS_CRATES.contains(&SERIES[s.series].program));
    let crates = if crates {
        paths.verbs_crates()?
    } else {
        paths.target.join("verbs-crates/release")
    };
    let script_file = paths.testbed.join("bench.sh");
    programs::write_script(&script_file, script::BENCH)?;
    let out = paths.target.join("bench");
    std::fs::create_dir_all(&out)?;
    let load_start = loadavg();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut samples: Vec<Sample> = Vec::new();
    let mut failures: Vec<Failure> = Vec::new();
    let mut kernel = String::new();
    let mut sched = String::new();
    for p in &profiles {
        let steps = plan::steps(p);
        if p.sizes.is_empty() || steps.is_empty() {
            fail!("{}: no size to measure", nodes_name(p.nodes));
        }
        let plan_file = out.join(format!("plan-{}node.txt", p.nodes));
        std::fs::write(&plan_file, plan::plan_text(p, &steps))?;
        let limit: u64 = steps
            .iter()
            .map(|s| p.step_limit(&SERIES[s.series], s.size) + 10)
            .sum();
        info(format!(
            "{}: {} steps ({} sizes, {} rounds; plan in {})",
            nodes_name(p.nodes),
            steps.len(),
            p.sizes.len(),
            p.rounds,
            plan_file.display()
        ));
        let argv: Vec<String> = vec![
            "sh".into(),
            script_file.display().to_string(),
            plan_file.display().to_string(),
            bench.display().to_string(),
            paths
                .root
                .join("examples/rdma_bench/cost_floor.c")
                .display()
                .to_string(),
            engine.display().to_string(),
            paths
                .root
                .join("python/examples/engine_bench.py")
                .display()
                .to_string(),
            python.display().to_string(),
            crates.display().to_string(),
        ];
        let opts = vm::Opts {
            nodes: p.nodes,
            timeout: Duration::from_secs(limit + 300),
            expose: paths.vm_expose(),
            env: paths.cluster_env()?,
            ..vm::Opts::default()
        };
        let (results, rebooted) = vm::run_past_emulator_fault(paths, &argv, &opts, false)?;
        if rebooted {
            info("(the first boot hit an emulator fault: see docs/testbed.md)");
        }
        let mut consoles = Vec::new();
        for r in &results {
            let file = out.join(format!("console-{}node-{}.txt", p.nodes, r.node));
            std::fs::write(&file, &r.console)?;
            consoles.push(r.console.as_str());
            let said = |what: &str| {
                r.console
                    .lines()
                    .find_map(|l| l.trim().strip_prefix(what))
                    .unwrap_or_default()
                    .to_string()
            };
            if kernel.is_empty() {
                kernel = said("### kernel ");
            }
            if sched.is_empty() {
                sched = said("### sched ");
            }
            let vm_id = format!("{}n/vm/{}", p.nodes, r.node);
            for problem in &r.problems {
                failures.push(Failure {
                    id: vm_id.clone(),
                    why: format!("kernel: {problem} (console in {})", file.display()),
                });
            }
            if r.status != Some(0) {
                failures.push(Failure {
                    id: vm_id,
                    why: format!(
                        "the VM's command ended with {:?} (console in {})",
                        r.status,
                        file.display()
                    ),
                });
            }
        }
        let (s, f) = results::collect(&steps, &consoles);
        samples.extend(s);
        failures.extend(f);
    }
    let load_end = loadavg();

    println!();
    for p in &profiles {
        for m in Metric::ALL
            .into_iter()
            .filter(|&m| m != Metric::Instructions)
        {
            // (Each engine bandwidth sample also holds its batch latency: a table of its own.)
            for value in json::value_names(m) {
                let t = table::values(&samples, m, p.nodes, value);
                if !t.is_empty() {
                    println!("{t}");
                }
            }
        }
        let t = ins::table(&samples, p.nodes);
        if !t.is_empty() {
            println!("{t}");
        }
        let g = table::goals(&samples, p.nodes);
        if !g.is_empty() {
            println!("{g}");
        }
        let (g, missed) = gates::check(&samples, p.nodes);
        if !g.is_empty() {
            println!("{g}");
        }
        failures.extend(missed);
    }
    info(format!("guest scheduler: {sched}"));
    info(format!(
        "host load average (1, 5, 15 min) at start {load_start}, at end {load_end}: \
         figures taken under load are noisy"
    ));

    let doc = json::document(
        &json::Context {
            profiles: &profiles,
            kernel: &kernel,
            sched: &sched,
            load: [load_start, load_end],
            started,
        },
        &samples,
        &failures,
    );
    let json_file = out.join("bench.json");
    std::fs::write(&json_file, serde_json::to_string_pretty(&doc)?)?;
    info(format!("every sample: {}", json_file.display()));
    failures.extend(draw_all(&samples, &profiles, &out));
    if failures.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    println!();
    for f in &failures {
        println!("FAILED {}: {}", f.id, f.why);
    }
    println!(
        "bench: {} step(s) or part(s) failed; the figures above are from the rest",
        failures.len()
    );
    Ok(ExitCode::FAILURE)
}

/// Draws every chart of `profiles` into `out`; says where, and returns what failed.
fn draw_all(samples: &[Sample], profiles: &[Profile], out: &Path) -> Vec<Failure> {
    let mut failures = Vec::new();
    for p in profiles {
        for (name, chart) in charts(samples, p) {
            match plot::draw(&chart, &out.join(format!("{name}-{}node", p.nodes))) {
                Ok(files) => info(format!(
                    "plot: {}",
                    files
                        .iter()
                        .map(|f| f.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
                Err(e) => failures.push(Failure {
                    id: format!("{}n/plot/{name}", p.nodes),
                    why: e,
                }),
            }
        }
    }
    failures
}

/// `--replot FILE`: the plots of a run's JSON file, drawn again into `out`.
fn replot(file: &Path, out: &Path) -> Result<ExitCode> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let (samples, profiles) = json::read(&doc).map_err(|e| format!("{}: {e}", file.display()))?;
    std::fs::create_dir_all(out)?;
    let failures = draw_all(&samples, &profiles, out);
    for f in &failures {
        println!("FAILED {}: {}", f.id, f.why);
    }
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The charts of one node count: bandwidth, latency, registration (one node) and the goals'
/// ratios, by file name.
fn charts(samples: &[Sample], p: &Profile) -> Vec<(&'static str, plot::Chart)> {
    let where_ = nodes_name(p.nodes);
    let lines = |m: Metric, value: &str, suffix: &str, dashed: bool| -> Vec<plot::Line> {
        let sp = spreads(samples, m, p.nodes, value);
        SERIES
            .iter()
            // (The engine's instruction count is per chunk: a gate, not a line of writes.)
            .filter(|s| s.metric == m && !(m == Metric::Instructions && s.engine()))
            .map(|s| plot::Line {
                label: format!("{}{suffix}", s.name),
                points: sp
                    .iter()
                    .filter(|((n, _), _)| *n == s.name)
                    .map(|((_, size), sp)| (*size, *sp))
                    .collect(),
                dashed,
            })
            .filter(|l| !l.points.is_empty())
            .collect()
    };
    let mut out = Vec::new();
    let spread_note = format!("median, bars min-max of {} rounds", p.rounds);
    let ins_note = "one round: the count is deterministic".to_string();
    for (name, m) in [
        ("bw", Metric::Bandwidth),
        ("lat", Metric::Latency),
        ("ins", Metric::Instructions),
    ] {
        let note = if m == Metric::Instructions {
            &ins_note
        } else {
            &spread_note
        };
        out.push((
            name,
            plot::Chart {
                title: format!("{}, {where_}", m.title()),
                y_label: format!("{} ({note})", m.unit()),
                lines: lines(m, m.value(), "", false),
                reference: None,
            },
        ));
    }
    let engine_lat = lines(Metric::Bandwidth, "batch_lat_usec", "", false);
    if !engine_lat.is_empty() {
        out.push((
            "engine-lat",
            plot::Chart {
                title: format!("transfer engine: batch latency, one block per peer, {where_}"),
                y_label: format!("usec ({spread_note})"),
                lines: engine_lat,
                reference: None,
            },
        ));
    }
    let mut reg = lines(Metric::Registration, "reg_usec", " reg", false);
    reg.extend(lines(Metric::Registration, "dereg_usec", " dereg", true));
    if !reg.is_empty() {
        out.push((
            "reg",
            plot::Chart {
                title: format!("registration and deregistration time, {where_}"),
                y_label: format!("usec ({spread_note})"),
                lines: reg,
                reference: None,
            },
        ));
    }
    let ratio_lines: Vec<plot::Line> = GOALS
        .iter()
        .map(|g| plot::Line {
            label: g.describe(),
            points: table::ratios(samples, g, p.nodes)
                .into_iter()
                .map(|(s, r)| {
                    (
                        s,
                        Spread {
                            min: r,
                            median: r,
                            max: r,
                            n: 1,
                        },
                    )
                })
                .collect(),
            dashed: g.metric == Metric::Registration,
        })
        .filter(|l| !l.points.is_empty())
        .collect();
    out.push((
        "ratios",
        plot::Chart {
            title: format!("goals as ratios of medians, {where_}"),
            y_label: "ratio (1 = equal)".into(),
            lines: ratio_lines,
            reference: Some(1.0),
        },
    ));
    out.retain(|(_, c)| !c.lines.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn options_parse_and_mistakes_are_named() {
        let r = parse_args(&words("--quick")).unwrap();
        assert_eq!(r.nodes, [1]);
        assert_eq!(r.profiles()[0], Profile::quick(1));
        let r = parse_args(&[]).unwrap();
        assert_eq!(r.nodes, [1, 2]);
        let r = parse_args(&words("--nodes 2 --sizes 8,4M --rounds 5")).unwrap();
        let p = &r.profiles()[0];
        assert_eq!(
            (p.nodes, p.rounds, p.sizes.clone()),
            (2, 5, vec![8, 4 << 20])
        );
        assert!(p.cost_sizes.is_empty());
        let r = parse_args(&words("--quick --sizes 8,4K,256K")).unwrap();
        assert_eq!(r.profiles()[0].cost_sizes, [8, 4 << 10]);
        assert_eq!(Profile::full(1).cost_sizes.len(), 5);
        let r = parse_args(&words("--nodes 1 --only perftest,engine")).unwrap();
        assert_eq!(r.profiles()[0].only, ["perftest", "engine"]);
        for bad in [
            "--only nope",
            "--only ,",
            "--nodes 3",
            "--rounds 0",
            "--rounds",
            "--sizes 16M",
            "--fast",
        ] {
            let e = parse_args(&words(bad)).unwrap_err().to_string();
            assert!(e.contains(bad.split(' ').next().unwrap()), "{bad}: {e}");
        }
    }

    #[test]
    fn charts_have_a_line_per_series_with_samples() {
        let mk = |series: usize, size: u64, x: f64| Sample {
            id: String::new(),
            series,
            nodes: 1,
            size,
            round: 1,
            iters: 5,
            values: [
                (SERIES[series].metric.value().to_string(), x),
                ("mpps".to_string(), x / size as f64),
            ]
            .into_iter()
            .collect(),
        };
        let s = [mk(0, 8, 1.0), mk(1, 8, 1.1), mk(0, 64, 2.0), mk(1, 64, 2.2)];
        let c = charts(&s, &Profile::quick(1));
        let names: Vec<_> = c.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["bw", "ratios"]);
        assert_eq!(c[0].1.lines.len(), 2);
        assert_eq!(c[0].1.lines[1].points.len(), 2);
        assert_eq!(c[1].1.lines[0].points[0].1.median, 1.1);
        // Instruction counts: a chart of their own, and the goal's ratio among the ratios.
        let ins = |name: &str| {
            SERIES
                .iter()
                .position(|s| s.name == name && s.metric == Metric::Instructions)
                .unwrap()
        };
        let s = [mk(ins("c"), 8, 305.0), mk(ins("ours/owned"), 8, 897.0)];
        let c = charts(&s, &Profile::quick(1));
        let names: Vec<_> = c.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["ins", "ratios"]);
        assert_eq!(c[0].1.lines[1].label, "ours/owned");
        assert_eq!(c[0].1.lines[1].points[0].1.median, 897.0);
        assert!(c[0]
            .1
            .y_label
            .starts_with("instructions per write (one round"));
        let owned = &c[1].1.lines[0];
        assert_eq!(owned.label, "ins ours/owned / c <= 1.10");
        assert_eq!(owned.points[0].1.median, 897.0 / 305.0);
    }
}
