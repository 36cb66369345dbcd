//! Tests of the bench plan (`plan.rs`).

use super::*;
use crate::series::{Metric, VERBS_CRATES};

#[test]
fn full_sweeps_every_power_of_two_and_two_nodes_reach_8_mib() {
    let one = Profile::full(1);
    assert_eq!(one.sizes.first(), Some(&2));
    assert_eq!(one.sizes.last(), Some(&(8 << 20)));
    assert_eq!(one.sizes.len(), 23);
    let two = Profile::full(2);
    assert!(two.sizes.iter().all(|&s| s <= TWO_NODE_MAX));
    assert_eq!(two.sizes.last(), Some(&(8 << 20)));
    assert!(steps(&two).iter().all(|s| SERIES[s.series].two_node));
    assert!(steps(&two).iter().all(|s| !SERIES[s.series].local()));
}

#[test]
fn iterations_fit_the_budget_within_bounds() {
    let p = Profile::quick(1);
    assert_eq!(p.iters(Metric::Bandwidth, 8), 300);
    assert_eq!(p.iters(Metric::Bandwidth, 64 << 10), 64);
    assert_eq!(p.iters(Metric::Bandwidth, 8 << 20), MIN_ITERS);
    assert_eq!(p.iters(Metric::Registration, 8), 5);
    assert!(p.limit(Metric::Bandwidth, 8 << 20) >= 60);
    assert!(Profile::full(1).limit(Metric::Latency, 8 << 20) <= 600);
}

#[test]
fn plans_interleave_and_have_unique_ids() {
    let p = Profile::quick(1);
    let st = steps(&p);
    let timed = SERIES
        .iter()
        .filter(|s| s.quick && !s.metric.counted() && !s.engine())
        .count();
    // Counts in the first round only, at both sizes (8 B and 64 KiB); the engine's three
    // bandwidth series (two from Rust, one from Python) at 64 KiB only, and its two counts
    // once.
    assert_eq!(st.len(), 3 * 2 * timed + 2 * 11 + 3 * 3 + 2);
    let ids: std::collections::BTreeSet<_> = st.iter().map(|s| &s.id).collect();
    assert_eq!(ids.len(), st.len());
    // perftest then ours, at the same size, in the same round.
    assert_eq!(st[0].id, "1n/r1/bw/perftest/8");
    assert_eq!(st[1].id, "1n/r1/bw/ours/host/8");
    let text = plan_text(&p, &st);
    let first = text.lines().nth(1).unwrap();
    assert_eq!(first, "pair 1n/r1/bw/perftest/8 60 ib_write_bw 8 300 ");
    assert!(text.contains("local 1n/r1/reg/ours/gpu/8 60 rdma_bench 8 5 reg --region gpu"));
    assert!(!text.contains("udmabuf"));
    assert!(plan_text(&Profile::full(1), &steps(&Profile::full(1))).contains("udmabuf"));
}

#[test]
fn the_verbs_crates_are_counted_only_from_8_bytes() {
    // Their loops write the iteration's number (8 bytes) and refuse a smaller size: a step
    // below 8 B would fail.
    let mut p = Profile::full(1);
    p.sizes = vec![2, 8];
    p.cost_sizes = vec![2, 8];
    let ids: Vec<_> = steps(&p)
        .into_iter()
        .filter(|s| VERBS_CRATES.contains(&SERIES[s.series].program))
        .map(|s| s.id)
        .collect();
    assert_eq!(
        ids,
        [
            "1n/r1/ins/sideway/8",
            "1n/r1/ins/sideway/basic/8",
            "1n/r1/ins/ibverbs/send/8"
        ]
    );
    assert!(steps(&p).iter().any(|s| s.id == "1n/r1/ins/c/2"));
}

#[test]
fn instructions_are_counted_in_the_first_round_at_the_cost_sizes_on_one_node() {
    let mut p = Profile::full(1);
    p.sizes = vec![8, 16, 64 << 10, 128 << 10];
    let st = steps(&p);
    let counts: Vec<_> = st
        .iter()
        .filter(|s| SERIES[s.series].metric == Metric::Instructions)
        .filter(|s| !SERIES[s.series].engine())
        .collect();
    assert_eq!(counts.len(), 2 * 11);
    assert!(counts
        .iter()
        .all(|s| s.round == 1 && s.size <= COST_MAX && s.size != 16));
    assert_eq!(counts[0].id, "1n/r1/ins/c/8");
    let text = plan_text(&p, &st);
    assert!(
        text.contains("\ncost 1n/r1/ins/c/8 300 cost_floor 8 10,60 1\n"),
        "{text}"
    );
    assert!(text.contains("cost 1n/r1/ins/c/batch/65536 300 cost_floor 65536 10,60 16\n"));
    assert!(text.contains("cost 1n/r1/ins/c/extended/8 300 cost_floor 8 10,60 1 extended\n"));
    assert!(
        text.contains("cost 1n/r1/ins/ours/owned/8 300 rdma_bench 8 10,60 cost --series owned\n")
    );
    // The verbs crates' loops take no arguments of their own.
    assert!(
        text.contains("cost 1n/r1/ins/sideway/8 300 sideway_cost 8 10,60 \n"),
        "{text}"
    );
    assert!(text.contains("cost 1n/r1/ins/sideway/basic/8 300 sideway_basic_cost 8 10,60 \n"));
    assert!(text.contains("cost 1n/r1/ins/ibverbs/send/8 300 ibverbs_cost 8 10,60 \n"));
    assert!(steps(&Profile::full(2))
        .iter()
        .all(|s| SERIES[s.series].metric != Metric::Instructions));
}

#[test]
fn the_engine_runs_from_4_kib_to_4_mib_beside_perftest_and_counts_once() {
    let mut p = Profile::full(1);
    p.sizes = vec![8, 4 << 10, 64 << 10, 8 << 20];
    p.only = vec!["perftest".into(), "engine".into()];
    let st = steps(&p);
    let ids: Vec<&str> = st
        .iter()
        .filter(|s| s.round == 1)
        .map(|s| s.id.as_str())
        .collect();
    assert_eq!(
        ids,
        [
            "1n/r1/bw/perftest/8",
            "1n/r1/lat/perftest/8",
            "1n/r1/bw/perftest/4096",
            "1n/r1/bw/engine/1peer/4096",
            "1n/r1/bw/engine/3peers/4096",
            "1n/r1/lat/perftest/4096",
            "1n/r1/alloc/engine/4096",
            "1n/r1/ins/engine/plan/4096",
            "1n/r1/bw/perftest/65536",
            "1n/r1/bw/engine/1peer/65536",
            "1n/r1/bw/engine/3peers/65536",
            "1n/r1/lat/perftest/65536",
            "1n/r1/bw/perftest/8388608",
            "1n/r1/lat/perftest/8388608",
        ]
    );
    assert_eq!(st.iter().filter(|s| s.id.contains("/alloc/")).count(), 1);
    assert_eq!(st.iter().filter(|s| s.id.contains("/ins/")).count(), 1);
    let text = plan_text(&p, &st);
    // The same messages as perftest's step; a local step (one process).
    assert!(
        text.contains("\npair 1n/r2/bw/perftest/65536 124 ib_write_bw 65536 512 \n"),
        "{text}"
    );
    assert!(
        text.contains(
            "\nlocal 1n/r2/bw/engine/3peers/65536 156 engine_bench 65536 512 bw --peers 3\n"
        ),
        "{text}"
    );
    assert!(text.contains("\nlocal 1n/r1/alloc/engine/4096 300 engine_bench 4096 256 alloc\n"));
    assert!(text.contains("\ncost 1n/r1/ins/engine/plan/4096 300 engine_bench 4096 10,60 cost\n"));
    // Not across two nodes; at a size list without 4 KiB..4 MiB, not at all.
    assert!(steps(&Profile::full(2))
        .iter()
        .all(|s| !SERIES[s.series].engine()));
    p.sizes = vec![8, 8 << 20];
    assert!(steps(&p).iter().all(|s| !SERIES[s.series].engine()));
}

#[test]
fn size_lists_parse() {
    assert_eq!(parse_sizes("8,64K,1M"), Ok(vec![8, 64 << 10, 1 << 20]));
    assert_eq!(parse_sizes("1M, 8"), Ok(vec![8, 1 << 20]));
    assert!(parse_sizes("9M").is_err());
    assert!(parse_sizes("x").is_err());
    assert!(parse_sizes("0").is_err());
    assert!(parse_sizes("").is_err());
}
