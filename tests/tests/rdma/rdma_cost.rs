//! The cost of one RDMA write in instructions, a measure that noise cannot move: valgrind's
//! callgrind counts the instructions retired in user space by the post and the completion of
//! each 8-byte write (`rdma_bench cost`, release build), for the owned, scoped and awaited
//! layers and for the same loop in C straight over libibverbs (`cost_floor.c`, the floor:
//! what the provider itself costs); and per write of a batch of 16 (`--series batch`,
//! `post_write_batch`, one completion per batch, through the extended send verbs; and
//! `--series batch-basic`, the same through `ibv_post_send`) beside the C loop posting the
//! same chain.
//! The C loop also runs over the extended verbs (`ibv_wr_*`, `ibv_start_poll`: sideway's
//! calls), for reference: the provider's share is smaller there.
//! Each count is the difference between a run of 60 iterations and one of 10, divided by 50
//! (and by 16 for batches), so start-up work drops out; the same binary and inputs give the
//! same count whatever the machine is doing. The test fails when one of ours grows more than
//! 10% over `tests/data/write_cost.txt`, and prints every count and its ratio to the C loop.
//! The same loop written with the Rust verbs crates (`bench/verbs-crates`: `sideway`'s
//! write on its extended queue pair and on its basic one, rust-ibverbs' send, as it has no
//! write) is counted the same way beside them, for
//! reference: their lines in the file are not gated, and the test prints whether our owned
//! write costs less than each.
//! Runs in the testbed VM; `cargo xtask test` builds the release `rdma_bench` and the verbs
//! crates' loops first.

use integration_tests::process::{run, text};
use integration_tests::testbed::Testbed;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(240);
const SIZE: &str = "8";
const SHORT: u64 = 10;
const LONG: u64 = 60;
/// Writes per iteration of the batch series (`rdma_bench`'s `batch::BATCH`).
const BATCH: u64 = 16;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The target folder this test binary was built in (`target/<profile>/deps/<test>`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors()
        .nth(3)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// Our series, each gated by its line in tests/data/write_cost.txt: `batch` posts through the
/// extended send verbs (rxe has them), `batch-basic` through `ibv_post_send` (the path of
/// providers without them).
const OURS: [&str; 5] = ["owned", "scoped", "awaited", "batch", "batch-basic"];

/// The C loops: (series, writes per iteration, `cost_floor`'s last argument). The extended
/// verbs' loops (`ibv_wr_*`, `ibv_start_poll`) are for reference: sideway's twin in C.
const C_LOOPS: [(&str, u64, Option<&str>); 4] = [
    ("c", 1, None),
    ("c-batch", BATCH, None),
    ("c-extended", 1, Some("extended")),
    ("c-extended-batch", BATCH, Some("extended")),
];

/// The loops written with the Rust verbs crates: (series, program in
/// `target/verbs-crates/release`).
const CRATES: [(&str, &str); 3] = [
    ("sideway", "sideway_cost"),
    ("sideway-basic", "sideway_basic_cost"),
    ("ibverbs-send", "ibverbs_cost"),
];

/// `target/verbs-crates/release/<name>`, one of the loops of `bench/verbs-crates`.
fn crate_loop(name: &str) -> PathBuf {
    let path = target_dir().join("verbs-crates/release").join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo xtask test` builds it (cargo build --release --manifest-path \
         bench/verbs-crates/Cargo.toml --target-dir target/verbs-crates)",
        path.display()
    );
    path
}

/// `target/release/examples/rdma_bench`, beside this test binary's `target/debug`.
fn release_bench() -> PathBuf {
    let path = target_dir().join("release/examples/rdma_bench");
    assert!(
        path.exists(),
        "{} is missing: `cargo xtask test` builds it (cargo build --release -p examples \
         --example rdma_bench)",
        path.display()
    );
    path
}

/// Compiles the C loop into `dir`.
fn cost_floor(dir: &Path) -> PathBuf {
    let out = dir.join("cost_floor");
    let src = workspace().join("examples/rdma_bench/cost_floor.c");
    let o = run(
        Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&out)
            .arg(&src)
            .arg("-libverbs"),
        T,
    );
    assert!(o.status.success(), "cc cost_floor.c:\n{}", text(&o));
    out
}

/// The instructions callgrind counted in `*measured_*` functions for `cmd`. A crate's loop
/// reports the polls that found its completion not yet queued (`misses=N`): those add empty
/// polls to the count, so a run with any fails.
fn counted(dir: &Path, name: &str, program: &Path, args: &[String]) -> u64 {
    let file = dir.join(format!("callgrind.{name}"));
    let o = run(
        Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", file.display()))
            .args(["--collect-atstart=no", "--toggle-collect=*measured_*"])
            .arg(program)
            .args(args),
        T,
    );
    assert!(o.status.success(), "{name}:\n{}", text(&o));
    let out = text(&o);
    if let Some(m) = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("misses="))
    {
        assert_eq!(
            m, "0",
            "{name}: polls found the queue empty, the count is off:\n{out}"
        );
    }
    let data = std::fs::read_to_string(&file).expect("callgrind output");
    data.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name}: no summary in {}", file.display()))
}

/// Instructions per iteration of one series: (count of LONG iterations - count of SHORT) /
/// difference.
fn per_iteration(
    dir: &Path,
    series: &str,
    run_with: impl Fn(u64) -> (PathBuf, Vec<String>),
) -> u64 {
    let at = |iters| {
        let (program, args) = run_with(iters);
        counted(dir, &format!("{series}.{iters}"), &program, &args)
    };
    let (short, long) = (at(SHORT), at(LONG));
    assert!(long > short && short > 0, "{series}: {short} then {long}");
    (long - short) / (LONG - SHORT)
}

fn baseline() -> BTreeMap<String, u64> {
    let path = workspace().join("tests/data/write_cost.txt");
    let text = std::fs::read_to_string(&path).expect("tests/data/write_cost.txt");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.split_once(' ').expect("name count");
            (k.to_string(), v.trim().parse().expect("a count"))
        })
        .collect()
}

#[test]
#[ignore = "needs the testbed VM"]
fn an_rdma_writes_instruction_count_does_not_grow() {
    let tb = Testbed::get();
    let dir = std::env::temp_dir().join(format!("rdma_cost.{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bench = release_bench();
    let floor = cost_floor(&dir);
    let mut counts = BTreeMap::new();
    for series in OURS {
        let n = per_iteration(&dir, series, |iters| {
            let args = [
                "cost", "--series", series, "--size", SIZE, "--device", &tb.device,
            ];
            let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            args.extend(["--iters".into(), iters.to_string()]);
            (bench.clone(), args)
        });
        // A batch's iteration is BATCH writes.
        let n = if series.starts_with("batch") {
            n / BATCH
        } else {
            n
        };
        counts.insert(series.to_string(), n);
    }
    for (name, batch, api) in C_LOOPS {
        let n = per_iteration(&dir, name, |iters| {
            let mut args = vec![
                tb.device.clone(),
                tb.gid_index.to_string(),
                SIZE.into(),
                iters.to_string(),
                batch.to_string(),
            ];
            args.extend(api.map(str::to_string));
            (floor.clone(), args)
        });
        counts.insert(name.into(), n / batch);
    }
    for (series, program) in CRATES {
        let program = crate_loop(program);
        let n = per_iteration(&dir, series, |iters| {
            let args = [
                tb.device.clone(),
                tb.gid_index.to_string(),
                SIZE.into(),
                iters.to_string(),
            ];
            (program.clone(), args.to_vec())
        });
        counts.insert(series.into(), n);
    }
    let c = counts["c"];
    let kept = baseline();
    let mut report = String::new();
    for (series, n) in &counts {
        // The batch is compared with the C loop posting the same chain.
        let (floor, floor_name) = if series.starts_with("batch") || series == "c-extended-batch" {
            (counts["c-batch"], "the C batch")
        } else {
            (c, "the C loop")
        };
        let kept_text = match kept.get(series.as_str()) {
            Some(&was) => format!(
                "kept: {was}, {:+.1}%",
                (*n as f64 / was as f64 - 1.0) * 100.0
            ),
            None => "not in tests/data/write_cost.txt".into(),
        };
        report += &format!(
            "{series:>12}: {n} instructions per write ({:.2}x {floor_name}; {kept_text})\n",
            *n as f64 / floor as f64,
        );
    }
    // The goal: our owned write below each crate's count for the same loop.
    let owned = counts["owned"];
    for (series, _) in CRATES {
        let theirs = counts[series];
        report += &format!(
            "owned vs {series}: {owned} {} {theirs}\n",
            if owned < theirs {
                "<"
            } else {
                ">= (the goal is not met)"
            }
        );
    }
    // What a crate adds to the provider's extended verbs, which sideway calls.
    report += &format!(
        "sideway less the C loop over the extended verbs: {} instructions of its own\n",
        counts["sideway"] as i64 - counts["c-extended"] as i64
    );
    eprintln!("{report}");
    for series in ["c", "c-extended"] {
        assert!(
            counts[series] > 100,
            "{series}'s count is implausible:\n{report}"
        );
    }
    for (series, _) in CRATES {
        assert!(
            counts[series] > 100,
            "{series}'s count is implausible:\n{report}"
        );
    }
    for series in OURS {
        let n = counts[series];
        let Some(&was) = kept.get(series) else {
            panic!("{series} has no line in tests/data/write_cost.txt:\n{report}");
        };
        assert!(
            n * 10 <= was * 11,
            "{series} grew more than 10% over tests/data/write_cost.txt:\n{report}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
